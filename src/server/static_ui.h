// server/static_ui.h — the hook for the built-in web UI's static files (a later issue embeds them).
// Owns: mapping a request path under `/` to an embedded file (body + content type).
// Must not: read the file system at request time or require an API key (static files are public).
// Threading: immutable data; safe from any HTTP thread.
#pragma once
#include <string>
#include <string_view>

namespace kiln::server {

struct StaticFile {
  std::string_view body;
  std::string_view content_type;
};

// The embedded file for `path` ("/" → the UI's index), or false when there is none. No files are
// embedded yet: the server answers `/` with a plain-text pointer to the API and docs/server.md.
bool find_static_file(std::string_view path, StaticFile& out);

}  // namespace kiln::server
