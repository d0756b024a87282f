# kiln_module(NAME DEPS dep...) — one library target per src/ directory.
# Sources are globbed (*.cpp, and *.cu when KILN_CUDA); a module with no sources yet
# is an INTERFACE library so the link graph is complete from day one.
# Include paths are rooted at src/: #include "core/check.h".
function(kiln_module name)
  cmake_parse_arguments(M "" "" "DEPS;EXTRA_GLOBS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp ${M_EXTRA_GLOBS})
  if(srcs)
    add_library(kiln_${name} STATIC ${srcs})
    target_include_directories(kiln_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(kiln_${name} PUBLIC ${M_DEPS})
  else()
    add_library(kiln_${name} INTERFACE)
    target_include_directories(kiln_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(kiln_${name} INTERFACE ${M_DEPS})
  endif()
endfunction()
