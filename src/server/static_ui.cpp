// server/static_ui.cpp — embedded web UI files: the chat page from webui/ (see server/webui.h).
#include "server/static_ui.h"

#include "server/webui.h"

namespace kiln::server {

bool find_static_file(std::string_view path, StaticFile& out) {
  return webui::find(path, out.body, out.content_type);
}

}  // namespace kiln::server
