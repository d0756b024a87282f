// gguf/reader.cpp — the hardened GGUF v2/v3 parser behind gguf::File (see reader.h).
//
// Layout (little-endian; v2 and v3 are identical on disk, v3 only added the big-endian variant):
//   magic "GGUF" u32 | version u32 | n_tensors u64 | n_kv u64
//   n_kv × { key: string, type: u32, value }        string = u64 length + bytes (no NUL)
//                                                    array  = elem_type u32 + count u64 + elems
//   n_tensors × { name: string, n_dims u32, ne[n_dims] i64, type u32, offset u64 }
//   padding to `general.alignment` (default 32) — the data section starts here
//   tensor data, each tensor at data_offset + offset
//
// Every length and count read from the file is checked against the bytes that remain BEFORE
// anything is allocated, so a forged 2^60 count costs nothing. All arithmetic on sizes goes
// through core/overflow.h.
#include "gguf/reader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/overflow.h"

namespace kiln::gguf {

namespace {

bool is_unsigned_type(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_signed_type(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
bool is_integer_type(ValueType t) { return is_signed_type(t) || is_unsigned_type(t); }

// Size on disk of a fixed-size value type; 0 for STRING / ARRAY (variable).
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

// Minimum bytes one element of type t occupies on disk (used to bound counts before allocating).
uint64_t min_disk_size(ValueType t) {
  if (t == ValueType::STRING) return 8;        // u64 length, possibly empty
  if (t == ValueType::ARRAY) return 4 + 8;     // elem type + count
  return scalar_size(t);
}

// Strict UTF-8 validation (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
    else return false;
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

// Printable form of an untrusted name for error messages (control bytes escaped, length capped).
std::string printable(std::string_view s) {
  std::string out;
  const size_t cap = 96;
  for (size_t i = 0; i < s.size() && i < cap; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'') out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > cap) out += "...";
  return out;
}

std::string type_desc(const Value& v) {
  if (v.type == ValueType::ARRAY) return fmt::format("array[{}]", value_type_name(v.elem_type));
  return std::string(value_type_name(v.type));
}

}  // namespace

bool Value::is_integer() const { return is_integer_type(type); }

// Spec limits that are facts of the format rather than tunables.
constexpr uint64_t kMaxKeyLen = 65535;        // GGUF spec: keys are at most 2^16-1 bytes
constexpr uint64_t kMaxTensorNameLen = 63;    // GGML_MAX_NAME (64) including the NUL
constexpr uint32_t kMaxDims = 4;              // GGML_MAX_DIMS

// What is being read, for error messages; formatted only when an error is reported.
struct Desc {
  std::string_view plain;          // "tensor count", "tensor 'x'", ...
  const std::string* key = nullptr;  // when set: "key 'K'"
  Desc(std::string_view p) : plain(p) {}
  Desc(const char* p) : plain(p) {}
  Desc(const std::string& p) : plain(p) {}
  static Desc of_key(const std::string& k) { Desc d(""); d.key = &k; return d; }
  std::string str() const { return key ? fmt::format("key '{}'", printable(*key)) : std::string(plain); }
};

class Parser {
 public:
  Parser(File& f, const Limits& lim) : f_(f), lim_(lim), data_(f.bytes_.data()), size_(f.bytes_.size()) {}

  Status run() {
    KILN_TRY(header());
    KILN_TRY(metadata());
    KILN_TRY(alignment());
    KILN_TRY(tensor_infos());
    KILN_TRY(data_section());
    return {};
  }

 private:
  File& f_;
  const Limits& lim_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  uint64_t meta_bytes_ = 0;  // estimated memory of parsed metadata, against lim_.max_metadata_bytes

  const std::string& name() const { return f_.name_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <class T>
  Status read(T* out, const Desc& what) {
    if (remaining() < sizeof(T))
      return err("{}: truncated file: {} needs {} bytes at offset {}, only {} remain", name(), what.str(), sizeof(T),
                 pos_, remaining());
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return {};
  }

  Status charge(uint64_t bytes, const Desc& what) {
    if (!checked_add(meta_bytes_, bytes, &meta_bytes_) || meta_bytes_ > lim_.max_metadata_bytes)
      return err("{}: {}: metadata needs more than the {}-byte memory limit", name(), what.str(), lim_.max_metadata_bytes);
    return {};
  }

  Status read_string(std::string* out, uint64_t max_len, const Desc& what) {
    uint64_t len = 0;
    KILN_TRY(read(&len, what));
    if (len > max_len)
      return err("{}: {}: string length {} exceeds the limit {} (at offset {})", name(), what.str(), len, max_len, pos_ - 8);
    if (len > remaining())
      return err("{}: {}: string length {} exceeds the {} bytes remaining in the file (at offset {})", name(), what.str(),
                 len, remaining(), pos_ - 8);
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return {};
  }

  Status header() {
    uint32_t magic = 0, version = 0;
    if (size_ < 4) return err("{}: not a GGUF file: {} bytes, too short for the magic", name(), size_);
    KILN_TRY(read(&magic, "magic"));
    if (magic != kMagic) {
      std::string m;
      for (int i = 0; i < 4; ++i) {
        const auto c = data_[i];
        m += (c >= 0x20 && c < 0x7f) ? fmt::format("{:c}", static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
      }
      return err("{}: not a GGUF file: magic is '{}', expected 'GGUF'", name(), m);
    }
    KILN_TRY(read(&version, "version"));
    if (version != 0 && (version & 0xffffu) == 0)
      return err("{}: GGUF version field is 0x{:08x}: this is a big-endian GGUF file, which is not supported "
                 "(only little-endian files)", name(), version);
    if (version == 1)
      return err("{}: GGUF version 1 is not supported (32-bit counts, obsolete); re-convert the model to v3", name());
    if (version != 2 && version != 3)
      return err("{}: unsupported GGUF version {} (supported: 2 and 3)", name(), version);
    f_.version_ = version;
    KILN_TRY(read(&n_tensors_, "tensor count"));
    KILN_TRY(read(&n_kv_, "metadata key count"));
    if (n_tensors_ > lim_.max_tensor_count)
      return err("{}: tensor count {} exceeds the limit {}", name(), n_tensors_, lim_.max_tensor_count);
    if (n_kv_ > lim_.max_kv_count)
      return err("{}: metadata key count {} exceeds the limit {}", name(), n_kv_, lim_.max_kv_count);
    return {};
  }

  // Reads a T from the file into *dst (a Value field wide enough for it).
  template <class T, class D>
  Status scalar(D* dst, const std::string& key) {
    T x = 0;
    KILN_TRY(read(&x, Desc::of_key(key)));
    *dst = x;
    return {};
  }

  Status value(Value* v, ValueType t, uint32_t depth, const std::string& key) {
    v->type = t;
    switch (t) {
      case ValueType::UINT8: return scalar<uint8_t>(&v->u, key);
      case ValueType::UINT16: return scalar<uint16_t>(&v->u, key);
      case ValueType::UINT32: return scalar<uint32_t>(&v->u, key);
      case ValueType::UINT64: return scalar<uint64_t>(&v->u, key);
      case ValueType::INT8: return scalar<int8_t>(&v->i, key);
      case ValueType::INT16: return scalar<int16_t>(&v->i, key);
      case ValueType::INT32: return scalar<int32_t>(&v->i, key);
      case ValueType::INT64: return scalar<int64_t>(&v->i, key);
      case ValueType::FLOAT32: return scalar<float>(&v->f, key);
      case ValueType::FLOAT64: return scalar<double>(&v->f, key);
      case ValueType::BOOL: {
        uint8_t x = 0;
        KILN_TRY(read(&x, Desc::of_key(key)));
        if (x > 1) return err("{}: key '{}': bool value is {}, expected 0 or 1 (at offset {})", name(), printable(key), x, pos_ - 1);
        v->b = x != 0;
        return {};
      }
      case ValueType::STRING:
        KILN_TRY(read_string(&v->str, lim_.max_string_len, Desc::of_key(key)));
        return charge(v->str.size(), Desc::of_key(key));
      case ValueType::ARRAY: return array(v, depth, key);
    }
    return err("{}: key '{}': invalid value type {}", name(), printable(key), static_cast<uint32_t>(t));
  }

  Status array(Value* v, uint32_t depth, const std::string& key) {
    if (depth >= lim_.max_array_depth)
      return err("{}: key '{}': arrays nested deeper than the limit {}", name(), printable(key), lim_.max_array_depth);
    uint32_t et = 0;
    uint64_t count = 0;
    KILN_TRY(read(&et, Desc::of_key(key)));
    if (et >= kValueTypeCount)
      return err("{}: key '{}': invalid array element type {} (at offset {})", name(), printable(key), et, pos_ - 4);
    v->elem_type = static_cast<ValueType>(et);
    KILN_TRY(read(&count, Desc::of_key(key)));
    if (count > lim_.max_array_len)
      return err("{}: key '{}': array length {} exceeds the limit {}", name(), printable(key), count, lim_.max_array_len);
    // Bound the count by the bytes left BEFORE allocating anything.
    const uint64_t min_elem = min_disk_size(v->elem_type);
    if (count > remaining() / min_elem)
      return err("{}: key '{}': array of {} {} elements needs at least {} bytes each, only {} bytes remain in the file",
                 name(), printable(key), count, value_type_name(v->elem_type), min_elem, remaining());
    uint64_t mem = 0;
    if (!checked_mul<uint64_t>(count, sizeof(Value), &mem))
      return err("{}: key '{}': array length {} overflows", name(), printable(key), count);
    KILN_TRY(charge(mem, Desc::of_key(key)));
    v->arr.resize(static_cast<size_t>(count));
    for (auto& e : v->arr) KILN_TRY(value(&e, v->elem_type, depth + 1, key));
    return {};
  }

  Status metadata() {
    // Each KV is at least 8 (key len) + 1 (key) + 4 (type) + 1 (value) bytes.
    f_.kvs_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv_, remaining() / 14)));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      KV kv;
      const auto what = fmt::format("metadata key #{}", i);
      KILN_TRY(read_string(&kv.key, kMaxKeyLen, what));
      if (kv.key.empty()) return err("{}: {} is an empty string", name(), what);
      if (!valid_utf8(kv.key)) return err("{}: {} ('{}') is not valid UTF-8", name(), what, printable(kv.key));
      if (f_.kv_index_.count(kv.key)) return err("{}: duplicate metadata key '{}'", name(), printable(kv.key));
      uint32_t t = 0;
      KILN_TRY(read(&t, Desc::of_key(kv.key)));
      if (t >= kValueTypeCount)
        return err("{}: key '{}' has invalid value type {} (at offset {})", name(), printable(kv.key), t, pos_ - 4);
      KILN_TRY(charge(sizeof(KV) + kv.key.size(), Desc::of_key(kv.key)));
      KILN_TRY(value(&kv.value, static_cast<ValueType>(t), 0, kv.key));
      f_.kv_index_.emplace(kv.key, f_.kvs_.size());
      f_.kvs_.push_back(std::move(kv));
    }
    return {};
  }

  Status alignment() {
    const Value* v = f_.find("general.alignment");
    if (!v) return {};
    // llama.cpp reads this key with gguf_get_val_u32 (aborting on any other type); we reject instead.
    if (v->type != ValueType::UINT32)
      return err("{}: key 'general.alignment' has type {}, expected u32", name(), type_desc(*v));
    if (v->u == 0 || (v->u & (v->u - 1)) != 0)
      return err("{}: key 'general.alignment' is {}, expected a non-zero power of two", name(), v->u);
    if (v->u > lim_.max_alignment)
      return err("{}: key 'general.alignment' is {}, exceeds the limit {}", name(), v->u, lim_.max_alignment);
    f_.alignment_ = v->u;
    return {};
  }

  Status tensor_infos() {
    // Each tensor info is at least 8 + 1 (name) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8 (offset) bytes.
    f_.tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors_, remaining() / 33)));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      TensorInfo t;
      const auto what = fmt::format("tensor #{} name", i);
      KILN_TRY(read_string(&t.name, 1ull << 16, what));
      if (t.name.empty()) return err("{}: {} is an empty string", name(), what);
      if (t.name.size() > kMaxTensorNameLen)
        return err("{}: tensor '{}': name is {} bytes, longer than the GGUF limit of {}", name(), printable(t.name),
                   t.name.size(), kMaxTensorNameLen);
      if (!valid_utf8(t.name)) return err("{}: {} ('{}') is not valid UTF-8", name(), what, printable(t.name));
      if (f_.tensor_index_.count(t.name)) return err("{}: duplicate tensor name '{}'", name(), printable(t.name));
      const std::string tdesc = fmt::format("tensor '{}'", printable(t.name));

      KILN_TRY(read(&t.n_dims, tdesc));
      if (t.n_dims < 1 || t.n_dims > kMaxDims)
        return err("{}: {}: n_dims is {}, expected 1 to {}", name(), tdesc, t.n_dims, kMaxDims);
      uint64_t n_el = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        int64_t ne = 0;
        KILN_TRY(read(&ne, tdesc));
        if (ne < 1) return err("{}: {}: dimension {} is {}, expected >= 1", name(), tdesc, d, ne);
        // n_elements() is int64_t: INT64_MAX bounds the count whatever the configured limit.
        if (!checked_mul<uint64_t>(n_el, static_cast<uint64_t>(ne), &n_el) || n_el > lim_.max_tensor_elements ||
            n_el > static_cast<uint64_t>(INT64_MAX))
          return err("{}: {}: element count overflows or exceeds the limit {} (dimension {} is {})", name(), tdesc,
                     lim_.max_tensor_elements, d, ne);
        t.ne[d] = ne;
      }
      uint32_t type_id = 0;
      KILN_TRY(read(&type_id, tdesc));
      const auto ti = type_info(type_id);
      if (!ti) return err("{}: {}: unknown ggml type id {}", name(), tdesc, type_id);
      t.type = ti->type;
      if (t.ne[0] % ti->block_size != 0)
        return err("{}: {}: ne[0] = {} is not a multiple of the {} block size {}", name(), tdesc, t.ne[0], ti->name,
                   ti->block_size);
      // n_bytes = (ne[0] / block) * type_size * ne[1] * ne[2] * ne[3], every step checked.
      uint64_t nb = static_cast<uint64_t>(t.ne[0]) / ti->block_size;
      bool ok = checked_mul<uint64_t>(nb, ti->type_size, &nb);
      for (int d = 1; d < 4 && ok; ++d) ok = checked_mul<uint64_t>(nb, static_cast<uint64_t>(t.ne[d]), &nb);
      if (!ok) return err("{}: {}: byte size overflows 64 bits", name(), tdesc);
      t.n_bytes = nb;
      KILN_TRY(read(&t.offset, tdesc));
      if (t.offset % f_.alignment_ != 0)
        return err("{}: {}: data offset {} is not a multiple of the alignment {}", name(), tdesc, t.offset,
                   f_.alignment_);
      f_.tensor_index_.emplace(t.name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
    }
    return {};
  }

  Status data_section() {
    uint64_t data_off = 0;
    if (!checked_align_up(pos_, f_.alignment_, &data_off))
      return err("{}: data section offset overflows", name());
    f_.data_offset_ = data_off;
    if (f_.tensors_.empty() || lim_.metadata_only) return {};
    const uint64_t avail = data_off <= size_ ? size_ - data_off : 0;  // data section may start past EOF
    for (const auto& t : f_.tensors_) {
      uint64_t end = 0;
      if (!checked_add(t.offset, t.n_bytes, &end) || end > avail)
        return err("{}: tensor '{}': data [{}, +{}) extends beyond the end of the data section ({} bytes; file is {} "
                   "bytes, data starts at {})", name(), printable(t.name), t.offset, t.n_bytes, avail, size_, data_off);
    }
    // Overlap: sort by offset and compare neighbours (n_bytes >= 1 for every tensor, dims are >= 1).
    std::vector<uint32_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return f_.tensors_[a].offset < f_.tensors_[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const auto& a = f_.tensors_[order[k - 1]];
      const auto& b = f_.tensors_[order[k]];
      if (a.offset + a.n_bytes > b.offset)
        return err("{}: tensors '{}' (data [{}, {})) and '{}' (data [{}, {})) overlap", name(), printable(a.name),
                   a.offset, a.offset + a.n_bytes, printable(b.name), b.offset, b.offset + b.n_bytes);
    }
    return {};
  }
};

Result<std::unique_ptr<File>> File::parse(std::span<const uint8_t> bytes, std::string name, const Limits& limits) {
  std::unique_ptr<File> f(new File());
  f->bytes_ = bytes;
  f->name_ = std::move(name);
  Parser p(*f, limits);
  KILN_TRY(p.run());
  return f;
}

Result<std::unique_ptr<File>> File::open(const std::string& path, const OpenOptions& opt) {
  auto m = MappedFile::open(path, opt.load_mode);
  if (!m.ok()) return m.error();
  auto map = std::move(m).value();
  auto f = parse(map->bytes(), path, opt.limits);
  if (!f.ok()) return f.error();
  f.value()->map_ = std::move(map);
  return f;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---- typed accessors ----

namespace {
Error missing(const std::string& file, std::string_view key) {
  return err("{}: key '{}' is missing", file, key);
}
Error wrong_type(const std::string& file, std::string_view key, const Value& v, std::string_view expected) {
  return err("{}: key '{}' has type {}, expected {}", file, key, type_desc(v), expected);
}
// Integer (scalar) -> int64; nullopt-like failure reported through ok=false with a reason.
Result<int64_t> as_int(const std::string& file, std::string_view key, const Value& v, std::string_view expected) {
  if (is_signed_type(v.type)) return v.i;
  if (is_unsigned_type(v.type)) {
    if (v.u > static_cast<uint64_t>(INT64_MAX))
      return err("{}: key '{}' is {}, too large for a signed 64-bit integer", file, key, v.u);
    return static_cast<int64_t>(v.u);
  }
  return wrong_type(file, key, v, expected);
}
}  // namespace

Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != ValueType::STRING) return wrong_type(name_, key, *v, "string");
  return v->str;
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  return as_int(name_, key, *v, "an integer");
}

Result<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (is_unsigned_type(v->type)) return v->u;
  if (is_signed_type(v->type)) {
    if (v->i < 0) return err("{}: key '{}' is {}, expected a non-negative integer", name_, key, v->i);
    return static_cast<uint64_t>(v->i);
  }
  return wrong_type(name_, key, *v, "an unsigned integer");
}

Result<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->is_float()) return v->f;
  if (is_signed_type(v->type)) return static_cast<double>(v->i);
  if (is_unsigned_type(v->type)) return static_cast<double>(v->u);
  return wrong_type(name_, key, *v, "a number");
}

Result<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != ValueType::BOOL) return wrong_type(name_, key, *v, "bool");
  return v->b;
}

Result<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING) return wrong_type(name_, key, *v, "array[string]");
  std::vector<std::string> out;
  out.reserve(v->arr.size());
  for (const auto& e : v->arr) out.push_back(e.str);
  return out;
}

Result<std::vector<int64_t>> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != ValueType::ARRAY || !is_integer_type(v->elem_type))
    return wrong_type(name_, key, *v, "an integer array");
  std::vector<int64_t> out;
  out.reserve(v->arr.size());
  for (size_t i = 0; i < v->arr.size(); ++i) {
    const Value& e = v->arr[i];
    if (is_unsigned_type(e.type) && e.u > static_cast<uint64_t>(INT64_MAX))
      return err("{}: key '{}' element {} is {}, too large for a signed 64-bit integer", name_, key, i, e.u);
    out.push_back(is_signed_type(e.type) ? e.i : static_cast<int64_t>(e.u));
  }
  return out;
}

Result<std::vector<double>> File::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != ValueType::ARRAY ||
      !(v->elem_type == ValueType::FLOAT32 || v->elem_type == ValueType::FLOAT64 || is_integer_type(v->elem_type)))
    return wrong_type(name_, key, *v, "a numeric array");
  std::vector<double> out;
  out.reserve(v->arr.size());
  for (const auto& e : v->arr)
    out.push_back(e.is_float() ? e.f : is_signed_type(e.type) ? static_cast<double>(e.i) : static_cast<double>(e.u));
  return out;
}

Result<int64_t> File::get_int_or(std::string_view key, int64_t dflt) const {
  return has(key) ? get_int(key) : Result<int64_t>(dflt);
}
Result<double> File::get_float_or(std::string_view key, double dflt) const {
  return has(key) ? get_float(key) : Result<double>(dflt);
}
Result<bool> File::get_bool_or(std::string_view key, bool dflt) const {
  return has(key) ? get_bool(key) : Result<bool>(dflt);
}

}  // namespace kiln::gguf
