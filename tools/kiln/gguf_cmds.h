// Actions of `kiln gguf`; argv[0] is the action name.
#pragma once
namespace kiln::tools {
int gguf_info_main(int argc, char** argv);  // gguf_info.cpp
int gguf_gen_main(int argc, char** argv);   // gguf_gen.cpp
int gguf_gen_mmproj_main(int argc, char** argv);  // gguf_gen_mmproj.cpp (gen with --mmproj)
}  // namespace kiln::tools
