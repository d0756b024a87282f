// gguf/reader.h — GGUF v2/v3 reader: header, typed metadata, tensor infos, data offsets.
// Owns: the parsed view of one file (metadata values are copied out; tensor data stays in
//       the mapping and is returned as pointers into it).
// Must not: know about models, architectures or how to compute with a tensor type.
// Hostile input: every size/offset is overflow-checked and bounds-checked against the file;
//       every failure is a returned Error naming the file and the key or tensor. Never aborts.
// Threading: immutable after open; safe to read from many threads.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mmap.h"
#include "core/result.h"
#include "gguf/types.h"

namespace kiln::gguf {

// One metadata value. Scalars are widened into u / i / f / b by signedness;
// `type` keeps the exact stored type. Arrays hold their element type and elements.
struct Value {
  ValueType type = ValueType::UINT8;
  uint64_t u = 0;      // UINT8/16/32/64
  int64_t i = 0;       // INT8/16/32/64
  double f = 0;        // FLOAT32/64
  bool b = false;      // BOOL
  std::string str;     // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY: element type
  std::vector<Value> arr;                  // ARRAY: elements (may be nested arrays)

  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
};

struct KV {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension
  uint64_t offset = 0;   // relative to the start of the data section
  uint64_t n_bytes = 0;  // ggml_nbytes: rows * (ne[0] / block_size) * type_size
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// Limits applied while parsing (defaults are generous for real models, finite for attackers).
struct Limits {
  uint64_t max_string_len = 1u << 24;        // 16 MiB per string (chat templates are < 1 MiB)
  uint64_t max_array_len = 1u << 24;         // 16 M elements (vocabularies are ~260 k)
  uint32_t max_array_depth = 4;              // nesting of arrays in arrays
  uint64_t max_kv_count = 1u << 16;
  uint64_t max_tensor_count = 1u << 20;
  uint64_t max_alignment = 1u << 16;         // general.alignment must be a power of two <= this
  uint64_t max_tensor_elements = 1ull << 40; // product of dims
  // Estimated memory of the parsed metadata (a Value per array element + string bytes). A file
  // cannot make the reader allocate more than this, whatever its size (a 1-byte u8 element
  // costs a ~100-byte Value). Real models need < 100 MiB.
  uint64_t max_metadata_bytes = 1ull << 30;
  // A metadata-only file (llama.cpp's only_meta; `kiln gguf gen --meta-only`): the tensor table is
  // read and checked, but the data section may be absent, so tensor data is neither bounds-checked
  // nor available (tensor_data() must not be used). For planning memory (`kiln fit`).
  bool metadata_only = false;
};

struct OpenOptions {
  LoadMode load_mode = LoadMode::Mmap;
  Limits limits;
};

class File {
 public:
  static Result<std::unique_ptr<File>> open(const std::string& path, const OpenOptions& opt = {});
  // Parses a buffer the caller keeps alive for the File's lifetime (fuzzing, tests).
  static Result<std::unique_ptr<File>> parse(std::span<const uint8_t> bytes, std::string name,
                                             const Limits& limits = {});

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data
  uint64_t file_size() const { return bytes_.size(); }

  // ---- metadata ----
  const std::vector<KV>& metadata() const { return kvs_; }
  const Value* find(std::string_view key) const;  // nullptr when missing
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed access; errors say "FILE: key 'K' is missing" or "... has type T, expected ...".
  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;     // any integer type (u64 > INT64_MAX is an error)
  Result<uint64_t> get_uint(std::string_view key) const;   // any non-negative integer
  Result<double> get_float(std::string_view key) const;    // float or integer types
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<double>> get_float_array(std::string_view key) const;
  // Shorthand for optional keys: returns dflt when missing, the error when present but wrong.
  Result<int64_t> get_int_or(std::string_view key, int64_t dflt) const;
  Result<double> get_float_or(std::string_view key, double dflt) const;
  Result<bool> get_bool_or(std::string_view key, bool dflt) const;

  // ---- tensors ----
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const uint8_t* tensor_data(const TensorInfo& t) const { return bytes_.data() + data_offset_ + t.offset; }

 private:
  File() = default;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KV> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  friend class Parser;
};

}  // namespace kiln::gguf
