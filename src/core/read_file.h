// core/read_file.h — the whole of a file as bytes (templates, prompts, test vectors).
// Owns nothing; no threading concerns.
#pragma once
#include <fstream>
#include <sstream>
#include <string>

namespace kiln {

// Reads all of `path` (binary) into out; false when the file cannot be opened.
inline bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

}  // namespace kiln
