// gguf/writer.h — GGUF v3 writer: metadata of every value type (nested arrays included), tensor
// infos, `general.alignment`, aligned tensor data.
// Owns: the layout of one output file. Tensor data is STREAMED: each tensor carries a callback that
//       produces its rows at write time into a bounded chunk buffer, so a file of any size is
//       written with O(chunk) memory (a 27B model is never held in memory).
// Must not: know about models or how to compute with a tensor type (callers hand it bytes); it only
//       uses the block geometry in gguf/types.h to size rows.
// Threading: one Writer per thread; the row callback runs on the thread that calls write().
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/reader.h"  // Value, the metadata value shared with the reader
#include "gguf/types.h"

namespace kiln::gguf {

// ---- building metadata values ----
Value make_u8(uint8_t v);
Value make_i8(int8_t v);
Value make_u16(uint16_t v);
Value make_i16(int16_t v);
Value make_u32(uint32_t v);
Value make_i32(int32_t v);
Value make_u64(uint64_t v);
Value make_i64(int64_t v);
Value make_f32(float v);
Value make_f64(double v);
Value make_bool(bool v);
Value make_string(std::string v);
// elem_type is the element type of the array; every element must have exactly that type
// (nested arrays: elem_type ARRAY and each element is itself an array Value).
Value make_array(ValueType elem_type, std::vector<Value> elems);
Value make_string_array(const std::vector<std::string>& v);
Value make_i32_array(const std::vector<int32_t>& v);
Value make_u32_array(const std::vector<uint32_t>& v);
Value make_f32_array(const std::vector<float>& v);
Value make_bool_array(const std::vector<bool>& v);

class Writer {
 public:
  // Fills rows [row0, row0 + n_rows) of the tensor into dst (n_rows * row_bytes bytes), where a
  // row is ne[0] elements and rows are numbered over ne[1]*ne[2]*ne[3]. Called in increasing row
  // order, in chunks of a few MiB, during write(). Must write every byte of dst.
  using RowFill = std::function<void(int64_t row0, int64_t n_rows, uint8_t* dst)>;

  // alignment: power of two; when it is not 32 the key general.alignment (u32) is written.
  explicit Writer(uint32_t alignment = kDefaultAlignment);

  uint32_t alignment() const { return alignment_; }

  // Sets (or replaces, keeping its position) a metadata key. Keys are written in insertion order.
  // "general.alignment" is managed by the constructor and may not be set here (checked).
  void set(std::string key, Value v);
  void set_string(std::string key, std::string v) { set(std::move(key), make_string(std::move(v))); }
  void set_u32(std::string key, uint32_t v) { set(std::move(key), make_u32(v)); }
  void set_i32(std::string key, int32_t v) { set(std::move(key), make_i32(v)); }
  void set_f32(std::string key, float v) { set(std::move(key), make_f32(v)); }
  void set_bool(std::string key, bool v) { set(std::move(key), make_bool(v)); }
  const std::vector<KV>& metadata() const { return kvs_; }

  // Declares a tensor; data comes from `fill` at write time. ne lists ne[0] (contiguous) first,
  // 1 to 4 dims. Errors (returned, naming the tensor): duplicate name, a dim < 1, ne[0] not a
  // multiple of the type's block size, more than 4 dims, an empty or over-long name.
  Status add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne, RowFill fill);
  // Convenience for small tensors: copies `data` (must be exactly the tensor's byte size).
  Status add_tensor_bytes(std::string name, GgmlType type, std::span<const int64_t> ne,
                          std::span<const uint8_t> data);

  struct TensorEntry {
    std::string name;
    GgmlType type;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t row_bytes;
    uint64_t n_rows;
    uint64_t n_bytes;
    uint64_t offset;  // relative to the data section, aligned
    RowFill fill;
  };
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  uint64_t data_size() const { return data_size_; }  // bytes of the data section (with padding)

  // Writes the file. Progress callback (optional) gets (tensor index, tensor count) before each
  // tensor. Errors: the file cannot be created or written (the partial file is removed).
  // meta_only: the header alone (metadata and tensor infos, no data section; llama.cpp's only_meta):
  // a file the reader opens with Limits::metadata_only, for planning memory without the weights.
  Status write(const std::string& path, const std::function<void(size_t, size_t)>& progress = {},
               bool meta_only = false) const;

  // Chunk size used for RowFill calls (bytes; at least one row). Default 8 MiB.
  void set_chunk_bytes(size_t n) { chunk_bytes_ = n; }

 private:
  uint32_t alignment_;
  std::vector<KV> kvs_;
  std::vector<TensorEntry> tensors_;
  uint64_t data_size_ = 0;
  size_t chunk_bytes_ = 8u << 20;
};

}  // namespace kiln::gguf
