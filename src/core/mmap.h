// core/mmap.h — read-only file mapping (or a plain read into memory).
// Owns: the mapping's lifetime; data() stays valid until destruction. Move-only.
// Threading: immutable after open; safe to read from many threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/result.h"

namespace kiln {

enum class LoadMode {
  Mmap,   // map the file (default)
  Mlock,  // map and lock in RAM (like llama-server --load-mode mlock / --mlock)
  Read,   // read the whole file into anonymous memory ("none")
};

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path, LoadMode mode = LoadMode::Mmap);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  bool locked() const { return locked_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  bool locked_ = false;
  std::unique_ptr<uint8_t[]> owned_;
};

}  // namespace kiln
