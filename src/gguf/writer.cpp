#include "gguf/writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/check.h"
#include "core/overflow.h"

namespace kiln::gguf {

// ---- value builders ----
namespace {
Value scalar(ValueType t) {
  Value v;
  v.type = t;
  return v;
}
}  // namespace

Value make_u8(uint8_t x) { Value v = scalar(ValueType::UINT8); v.u = x; return v; }
Value make_i8(int8_t x) { Value v = scalar(ValueType::INT8); v.i = x; return v; }
Value make_u16(uint16_t x) { Value v = scalar(ValueType::UINT16); v.u = x; return v; }
Value make_i16(int16_t x) { Value v = scalar(ValueType::INT16); v.i = x; return v; }
Value make_u32(uint32_t x) { Value v = scalar(ValueType::UINT32); v.u = x; return v; }
Value make_i32(int32_t x) { Value v = scalar(ValueType::INT32); v.i = x; return v; }
Value make_u64(uint64_t x) { Value v = scalar(ValueType::UINT64); v.u = x; return v; }
Value make_i64(int64_t x) { Value v = scalar(ValueType::INT64); v.i = x; return v; }
Value make_f32(float x) { Value v = scalar(ValueType::FLOAT32); v.f = x; return v; }
Value make_f64(double x) { Value v = scalar(ValueType::FLOAT64); v.f = x; return v; }
Value make_bool(bool x) { Value v = scalar(ValueType::BOOL); v.b = x; return v; }
Value make_string(std::string x) { Value v = scalar(ValueType::STRING); v.str = std::move(x); return v; }

Value make_array(ValueType elem_type, std::vector<Value> elems) {
  Value v = scalar(ValueType::ARRAY);
  v.elem_type = elem_type;
  v.arr = std::move(elems);
  return v;
}
namespace {
// One array Value from a vector of scalars, each built by `make`.
template <class T, class Make>
Value array_of(ValueType elem_type, const std::vector<T>& xs, Make make) {
  std::vector<Value> e;
  e.reserve(xs.size());
  for (const auto& x : xs) e.push_back(make(x));
  return make_array(elem_type, std::move(e));
}
}  // namespace

Value make_string_array(const std::vector<std::string>& xs) { return array_of(ValueType::STRING, xs, make_string); }
Value make_i32_array(const std::vector<int32_t>& xs) { return array_of(ValueType::INT32, xs, make_i32); }
Value make_u32_array(const std::vector<uint32_t>& xs) { return array_of(ValueType::UINT32, xs, make_u32); }
Value make_f32_array(const std::vector<float>& xs) { return array_of(ValueType::FLOAT32, xs, make_f32); }
Value make_bool_array(const std::vector<bool>& xs) { return array_of(ValueType::BOOL, xs, make_bool); }

namespace {
// Checks that a value is well formed (array elements all of elem_type, recursively).
void check_value(const Value& v, const std::string& key) {
  KILN_CHECK(static_cast<uint32_t>(v.type) < kValueTypeCount, "gguf writer: key '{}' has a bad type", key);
  if (v.type != ValueType::ARRAY) return;
  KILN_CHECK(static_cast<uint32_t>(v.elem_type) < kValueTypeCount, "gguf writer: key '{}' has a bad element type", key);
  for (const auto& e : v.arr) {
    KILN_CHECK(e.type == v.elem_type, "gguf writer: key '{}': array element of type {} in an array of {}", key,
               value_type_name(e.type), value_type_name(v.elem_type));
    check_value(e, key);
  }
}

// Buffered little-endian serialisation into a FILE*. The first error sticks.
class Out {
 public:
  explicit Out(std::FILE* f) : f_(f) {}
  bool ok() const { return ok_; }
  uint64_t pos() const { return pos_; }
  void bytes(const void* p, size_t n) {
    if (!ok_ || n == 0) return;
    if (std::fwrite(p, 1, n, f_) != n) ok_ = false;
    pos_ += n;
  }
  template <class T>
  void pod(T v) { bytes(&v, sizeof v); }  // x86-64/aarch64 are little-endian, as GGUF is
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void zeros(uint64_t n) {
    static const uint8_t z[256] = {};
    while (n > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof z));
      bytes(z, k);
      n -= k;
    }
  }
  void value_body(const Value& v) {
    switch (v.type) {
      case ValueType::UINT8: pod<uint8_t>(static_cast<uint8_t>(v.u)); break;
      case ValueType::INT8: pod<int8_t>(static_cast<int8_t>(v.i)); break;
      case ValueType::UINT16: pod<uint16_t>(static_cast<uint16_t>(v.u)); break;
      case ValueType::INT16: pod<int16_t>(static_cast<int16_t>(v.i)); break;
      case ValueType::UINT32: pod<uint32_t>(static_cast<uint32_t>(v.u)); break;
      case ValueType::INT32: pod<int32_t>(static_cast<int32_t>(v.i)); break;
      case ValueType::UINT64: pod<uint64_t>(v.u); break;
      case ValueType::INT64: pod<int64_t>(v.i); break;
      case ValueType::FLOAT32: pod<float>(static_cast<float>(v.f)); break;
      case ValueType::FLOAT64: pod<double>(v.f); break;
      case ValueType::BOOL: pod<uint8_t>(v.b ? 1 : 0); break;
      case ValueType::STRING: str(v.str); break;
      case ValueType::ARRAY:
        pod<uint32_t>(static_cast<uint32_t>(v.elem_type));
        pod<uint64_t>(v.arr.size());
        for (const auto& e : v.arr) value_body(e);
        break;
    }
  }

 private:
  std::FILE* f_;
  bool ok_ = true;
  uint64_t pos_ = 0;
};
}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  KILN_CHECK(alignment >= 1 && (alignment & (alignment - 1)) == 0, "gguf writer: alignment {} is not a power of two",
             alignment);
  if (alignment != kDefaultAlignment) kvs_.push_back({"general.alignment", make_u32(alignment)});
}

void Writer::set(std::string key, Value v) {
  KILN_CHECK(key != "general.alignment", "gguf writer: general.alignment is set by the Writer constructor");
  KILN_CHECK(!key.empty(), "gguf writer: empty key");
  check_value(v, key);
  for (auto& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(v);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(v)});
}

Status Writer::add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne, RowFill fill) {
  if (name.empty() || name.size() > 64 * 1024) return err("gguf writer: tensor name '{}' is empty or too long", name);
  for (const auto& t : tensors_)
    if (t.name == name) return err("gguf writer: duplicate tensor '{}'", name);
  if (ne.empty() || ne.size() > 4) return err("gguf writer: tensor '{}' has {} dims (1..4 allowed)", name, ne.size());
  const TypeInfo& ti = type_info(type);
  TensorEntry e;
  e.name = std::move(name);
  e.type = type;
  e.n_dims = static_cast<uint32_t>(ne.size());
  for (int i = 0; i < 4; ++i) e.ne[i] = i < static_cast<int>(ne.size()) ? ne[i] : 1;
  for (int i = 0; i < 4; ++i)
    if (e.ne[i] < 1) return err("gguf writer: tensor '{}' has ne[{}] = {}", e.name, i, e.ne[i]);
  if (e.ne[0] % ti.block_size != 0)
    return err("gguf writer: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", e.name, e.ne[0],
               ti.name, ti.block_size);
  uint64_t rows = 1, bytes = 0;
  bool ok = true;
  for (int i = 1; i < 4; ++i) ok = ok && checked_mul<uint64_t>(rows, static_cast<uint64_t>(e.ne[i]), &rows);
  e.row_bytes = static_cast<uint64_t>(e.ne[0] / ti.block_size) * ti.type_size;
  ok = ok && checked_mul<uint64_t>(rows, e.row_bytes, &bytes);
  uint64_t off = 0, end = 0;
  ok = ok && checked_align_up(data_size_, alignment_, &off) && checked_add<uint64_t>(off, bytes, &end);
  if (!ok) return err("gguf writer: tensor '{}' is too large", e.name);
  e.n_rows = rows;
  e.n_bytes = bytes;
  e.offset = off;
  e.fill = std::move(fill);
  data_size_ = end;
  tensors_.push_back(std::move(e));
  return {};
}

Status Writer::add_tensor_bytes(std::string name, GgmlType type, std::span<const int64_t> ne,
                                std::span<const uint8_t> data) {
  auto copy = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
  const std::string nm = name;
  const uint64_t prev_size = data_size_;
  KILN_TRY(add_tensor(std::move(name), type, ne, nullptr));
  auto& e = tensors_.back();
  if (e.n_bytes != copy->size()) {
    const uint64_t want = e.n_bytes;
    tensors_.pop_back();
    data_size_ = prev_size;
    return err("gguf writer: tensor '{}' needs {} bytes, {} given", nm, want, copy->size());
  }
  const uint64_t rb = e.row_bytes;
  e.fill = [copy, rb](int64_t row0, int64_t n_rows, uint8_t* dst) {
    std::memcpy(dst, copy->data() + static_cast<uint64_t>(row0) * rb, static_cast<uint64_t>(n_rows) * rb);
  };
  return {};
}

Status Writer::write(const std::string& path, const std::function<void(size_t, size_t)>& progress,
                     bool meta_only) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return err("{}: cannot create: {}", path, std::strerror(errno));
  std::unique_ptr<char[]> iobuf(new char[1u << 20]);
  std::setvbuf(f, iobuf.get(), _IOFBF, 1u << 20);
  Out out(f);

  out.pod<uint32_t>(kMagic);
  out.pod<uint32_t>(3);
  out.pod<uint64_t>(tensors_.size());
  out.pod<uint64_t>(kvs_.size());
  for (const auto& kv : kvs_) {
    out.str(kv.key);
    out.pod<uint32_t>(static_cast<uint32_t>(kv.value.type));
    out.value_body(kv.value);
  }
  for (const auto& t : tensors_) {
    out.str(t.name);
    out.pod<uint32_t>(t.n_dims);
    for (uint32_t i = 0; i < t.n_dims; ++i) out.pod<uint64_t>(static_cast<uint64_t>(t.ne[i]));
    out.pod<uint32_t>(static_cast<uint32_t>(t.type));
    out.pod<uint64_t>(t.offset);
  }
  uint64_t data_start = 0;
  KILN_CHECK(checked_align_up(out.pos(), alignment_, &data_start), "gguf writer: header too large");
  if (!meta_only) out.zeros(data_start - out.pos());

  std::vector<uint8_t> chunk;
  uint64_t written = 0;  // bytes of the data section written so far
  for (size_t ti = 0; ti < tensors_.size() && out.ok() && !meta_only; ++ti) {
    const auto& t = tensors_[ti];
    if (progress) progress(ti, tensors_.size());
    out.zeros(t.offset - written);
    written = t.offset;
    const uint64_t rows_per_chunk = std::max<uint64_t>(1, chunk_bytes_ / std::max<uint64_t>(1, t.row_bytes));
    for (uint64_t r = 0; r < t.n_rows && out.ok(); r += rows_per_chunk) {
      const uint64_t n = std::min(rows_per_chunk, t.n_rows - r);
      const uint64_t nb = n * t.row_bytes;
      if (chunk.size() < nb) chunk.resize(nb);
      if (t.fill) {
        t.fill(static_cast<int64_t>(r), static_cast<int64_t>(n), chunk.data());
      } else {
        std::memset(chunk.data(), 0, nb);
      }
      out.bytes(chunk.data(), nb);
    }
    written += t.n_bytes;
  }
  if (progress) progress(tensors_.size(), tensors_.size());
  // Trailing padding so the file ends on an alignment boundary, as ggml's writer does.
  if (out.ok() && !tensors_.empty() && !meta_only) {
    uint64_t end = 0;
    KILN_CHECK(checked_align_up(written, alignment_, &end), "gguf writer: data too large");
    out.zeros(end - written);
  }
  const bool ok = out.ok();
  const int saved_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(path.c_str());
    return err("{}: write failed: {}", path, std::strerror(ok ? errno : saved_errno));
  }
  return {};
}

}  // namespace kiln::gguf
