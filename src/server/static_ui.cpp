// server/static_ui.cpp — embedded web UI files: none yet (see static_ui.h).
#include "server/static_ui.h"

namespace kiln::server {

bool find_static_file(std::string_view path, StaticFile& out) {
  (void)path;
  (void)out;
  return false;
}

}  // namespace kiln::server
