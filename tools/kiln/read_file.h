// tools/kiln/read_file.h — the whole of a file as bytes, for the subcommands that take input files.
#pragma once
#include <fstream>
#include <sstream>
#include <string>

namespace kiln::tools {

// Reads all of `path` (binary) into out; false when the file cannot be opened.
inline bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

}  // namespace kiln::tools
