// server/webui.h — the built-in browser chat UI (webui/), embedded in the binary at build time.
// Owns: the embedded files, looked up by request path. The page is one self-contained HTML file
//   (our webui/app.{js,css} plus Debian's markdown-it, highlight.js and KaTeX inlined by
//   webui/embed.cmake); the implementation is generated (build/webui/webui_assets.cpp) and lives
//   in the kiln_webui library, which kiln_server links.
// Must not: read the file system or the network at run time; require an API key (the page is
//   public; the API calls it makes carry the key the user enters).
// Threading: immutable static data; safe from any thread.
#pragma once
#include <string_view>

namespace kiln::server::webui {

// The embedded file for `path` ("/" and "/index.html" → the chat page), or false when there is
// none. `body` and `content_type` point at static storage.
bool find(std::string_view path, std::string_view& body, std::string_view& content_type);

// Whether the page was built with the optional libraries (markdown-it, highlight.js, KaTeX);
// without them it still works and shows replies as plain text.
bool has_libraries();

}  // namespace kiln::server::webui
