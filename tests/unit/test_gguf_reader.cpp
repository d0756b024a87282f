// Tests for gguf::File (src/gguf/reader.cpp): handcrafted files from a byte builder defined here
// (independent of gguf/writer), one regression test per known GGUF-loader vulnerability class
// (docs/gguf.md), and the real llama.cpp vocabulary files in ../shared/data/vocab.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/reader.h"

// The probe below replaces global new/delete with malloc/free; gcc cannot see they pair up.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

using namespace kiln;
using namespace kiln::gguf;

// ---- allocation probe: the largest single allocation made while the probe is armed ----
// Proves that forged counts/lengths are rejected before anything is allocated.
static std::atomic<bool> g_probe{false};
static std::atomic<size_t> g_max_alloc{0};
void* operator new(size_t n) {
  if (g_probe.load(std::memory_order_relaxed)) {
    size_t cur = g_max_alloc.load(std::memory_order_relaxed);
    while (n > cur && !g_max_alloc.compare_exchange_weak(cur, n)) {}
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

// Arms the probe for its lifetime; on destruction checks that no allocation reached 1 MiB.
struct AllocProbe {
  AllocProbe() {
    g_max_alloc = 0;
    g_probe = true;
  }
  ~AllocProbe() {
    g_probe = false;
    EXPECT_LT(g_max_alloc.load(), size_t(1) << 20);
  }
};

namespace {

// ---- byte builder (little-endian, the GGUF layout written out by hand) ----
struct Builder {
  std::vector<uint8_t> b;
  template <class T>
  Builder& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Builder& raw(std::string_view s) { b.insert(b.end(), s.begin(), s.end()); return *this; }
  Builder& str(std::string_view s) { put<uint64_t>(s.size()); return raw(s); }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    raw("GGUF");
    put<uint32_t>(version);
    put<uint64_t>(n_tensors);
    return put<uint64_t>(n_kv);
  }
  Builder& key(std::string_view k, ValueType t) { str(k); return put<uint32_t>(uint32_t(t)); }
  Builder& kv_u32(std::string_view k, uint32_t v) { key(k, ValueType::UINT32); return put(v); }
  Builder& kv_str(std::string_view k, std::string_view v) { key(k, ValueType::STRING); return str(v); }
  Builder& arr_hdr(std::string_view k, ValueType et, uint64_t n) {
    key(k, ValueType::ARRAY);
    put<uint32_t>(uint32_t(et));
    return put<uint64_t>(n);
  }
  Builder& tensor(std::string_view name, std::vector<int64_t> ne, GgmlType type, uint64_t offset) {
    str(name);
    put<uint32_t>(uint32_t(ne.size()));
    for (auto d : ne) put<int64_t>(d);
    put<uint32_t>(uint32_t(type));
    return put<uint64_t>(offset);
  }
  Builder& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Builder& zeros(size_t n) { b.insert(b.end(), n, 0); return *this; }
  Builder& fill(size_t n, uint8_t start) {
    for (size_t i = 0; i < n; ++i) b.push_back(uint8_t(start + i));
    return *this;
  }
};

const char* kName = "t.gguf";

Result<std::unique_ptr<File>> parse(const Builder& b, const Limits& lim = {}) {
  return File::parse(std::span<const uint8_t>(b.b.data(), b.b.size()), kName, lim);
}

// Asserts that parsing fails and the message contains every fragment.
void expect_error(const Builder& b, std::initializer_list<std::string_view> fragments, const Limits& lim = {}) {
  auto r = parse(b, lim);
  ASSERT_FALSE(r.ok()) << "expected a parse error";
  const auto& m = r.error().message;
  EXPECT_EQ(m.rfind(std::string(kName) + ": ", 0), 0u) << "message must start with the file name: " << m;
  for (auto f : fragments) EXPECT_NE(m.find(f), std::string::npos) << "'" << f << "' not in: " << m;
}

// A file exercising every value type, nested arrays and three tensors of different types.
Builder rich_file() {
  Builder b;
  b.header(3, 18);
  b.kv_str("general.architecture", "llama");
  b.key("v.u8", ValueType::UINT8).put<uint8_t>(200);
  b.key("v.i8", ValueType::INT8).put<int8_t>(-100);
  b.key("v.u16", ValueType::UINT16).put<uint16_t>(60000);
  b.key("v.i16", ValueType::INT16).put<int16_t>(-30000);
  b.kv_u32("v.u32", 4000000000u);
  b.key("v.i32", ValueType::INT32).put<int32_t>(-2000000000);
  b.key("v.f32", ValueType::FLOAT32).put<float>(0.25f);
  b.key("v.bool", ValueType::BOOL).put<uint8_t>(1);
  b.key("v.u64", ValueType::UINT64).put<uint64_t>(18000000000000000000ull);
  b.key("v.i64", ValueType::INT64).put<int64_t>(-9000000000000000000ll);
  b.key("v.f64", ValueType::FLOAT64).put<double>(-1.5e300);
  b.arr_hdr("a.str", ValueType::STRING, 3).str("a").str("").str("\xe4\xb8\xad");
  b.arr_hdr("a.i32", ValueType::INT32, 3).put<int32_t>(-1).put<int32_t>(0).put<int32_t>(7);
  b.arr_hdr("a.f32", ValueType::FLOAT32, 2).put<float>(1.5f).put<float>(-2.0f);
  b.arr_hdr("a.nested", ValueType::ARRAY, 2);
  b.put<uint32_t>(uint32_t(ValueType::UINT16)).put<uint64_t>(2).put<uint16_t>(1).put<uint16_t>(2);
  b.put<uint32_t>(uint32_t(ValueType::UINT16)).put<uint64_t>(0);
  b.arr_hdr("a.empty", ValueType::UINT8, 0);
  b.arr_hdr("a.bool", ValueType::BOOL, 2).put<uint8_t>(0).put<uint8_t>(1);
  // tensors: F32 [4, 2] = 32 B at 0; Q4_K [256] = 144 B at 32; Q8_0 [32, 3] = 102 B at 192
  b.tensor("token_embd.weight", {4, 2}, GgmlType::F32, 0);
  b.tensor("blk.0.attn_q.weight", {256}, GgmlType::Q4_K, 32);
  b.tensor("output.weight", {32, 3}, GgmlType::Q8_0, 192);
  b.pad_to(32);
  b.fill(192, 0).fill(102, 7);
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Valid files
// ---------------------------------------------------------------------------------------------

TEST(GgufReader, MinimalEmptyFile) {
  Builder b;
  b.header(0, 0);
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value()->version(), 3u);
  EXPECT_EQ(r.value()->alignment(), 32u);
  EXPECT_EQ(r.value()->data_offset(), 32u);  // 24-byte header rounded up to 32
  EXPECT_TRUE(r.value()->metadata().empty());
  EXPECT_TRUE(r.value()->tensors().empty());
}

TEST(GgufReader, Version2IsAccepted) {
  Builder b;
  b.header(0, 1, 2).kv_str("general.name", "v2");
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value()->version(), 2u);
  EXPECT_EQ(r.value()->get_string("general.name").value(), "v2");
}

TEST(GgufReader, EveryValueType) {
  auto b = rich_file();
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const File& f = *r.value();
  ASSERT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.metadata()[0].key, "general.architecture");  // file order is kept
  EXPECT_EQ(f.find("v.u8")->type, ValueType::UINT8);
  EXPECT_EQ(f.find("v.u8")->u, 200u);
  EXPECT_EQ(f.find("v.i8")->i, -100);
  EXPECT_EQ(f.find("v.u16")->u, 60000u);
  EXPECT_EQ(f.find("v.i16")->i, -30000);
  EXPECT_EQ(f.find("v.u32")->u, 4000000000u);
  EXPECT_EQ(f.find("v.i32")->i, -2000000000);
  EXPECT_EQ(f.find("v.f32")->f, 0.25);
  EXPECT_TRUE(f.find("v.bool")->b);
  EXPECT_EQ(f.find("v.u64")->u, 18000000000000000000ull);
  EXPECT_EQ(f.find("v.i64")->i, -9000000000000000000ll);
  EXPECT_EQ(f.find("v.f64")->f, -1.5e300);
  EXPECT_TRUE(f.find("v.u32")->is_integer());
  EXPECT_FALSE(f.find("v.f32")->is_integer());
  EXPECT_TRUE(f.find("v.f64")->is_float());
  const Value* n = f.find("a.nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, ValueType::ARRAY);
  EXPECT_EQ(n->elem_type, ValueType::ARRAY);
  ASSERT_EQ(n->arr.size(), 2u);
  EXPECT_EQ(n->arr[0].elem_type, ValueType::UINT16);
  ASSERT_EQ(n->arr[0].arr.size(), 2u);
  EXPECT_EQ(n->arr[0].arr[1].u, 2u);
  EXPECT_TRUE(n->arr[1].arr.empty());
  EXPECT_EQ(f.find("a.empty")->arr.size(), 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_FALSE(f.has("missing"));
}

TEST(GgufReader, TypedAccessors) {
  auto b = rich_file();
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const File& f = *r.value();
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_int("v.i8").value(), -100);
  EXPECT_EQ(f.get_int("v.u32").value(), 4000000000ll);
  EXPECT_EQ(f.get_uint("v.u64").value(), 18000000000000000000ull);
  EXPECT_EQ(f.get_uint("v.u16").value(), 60000u);
  EXPECT_EQ(f.get_float("v.f32").value(), 0.25);
  EXPECT_EQ(f.get_float("v.i32").value(), -2000000000.0);
  EXPECT_EQ(f.get_bool("v.bool").value(), true);
  EXPECT_EQ(f.get_string_array("a.str").value(), (std::vector<std::string>{"a", "", "\xe4\xb8\xad"}));
  EXPECT_EQ(f.get_int_array("a.i32").value(), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(f.get_float_array("a.f32").value(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f.get_float_array("a.i32").value(), (std::vector<double>{-1, 0, 7}));
  EXPECT_EQ(f.get_int_or("nope", 42).value(), 42);
  EXPECT_EQ(f.get_int_or("v.i16", 42).value(), -30000);
  EXPECT_EQ(f.get_float_or("nope", 2.5).value(), 2.5);
  EXPECT_EQ(f.get_bool_or("nope", true).value(), true);
  EXPECT_EQ(f.get_bool_or("v.bool", false).value(), true);

  // error messages name the file, the key and both types
  EXPECT_EQ(f.get_string("nope").error().message, "t.gguf: key 'nope' is missing");
  EXPECT_EQ(f.get_string("v.u32").error().message, "t.gguf: key 'v.u32' has type u32, expected string");
  EXPECT_EQ(f.get_bool("v.u8").error().message, "t.gguf: key 'v.u8' has type u8, expected bool");
  EXPECT_EQ(f.get_string_array("a.i32").error().message,
            "t.gguf: key 'a.i32' has type array[i32], expected array[string]");
  EXPECT_NE(f.get_int("v.u64").error().message.find("too large"), std::string::npos);  // > INT64_MAX
  EXPECT_NE(f.get_uint("v.i8").error().message.find("non-negative"), std::string::npos);
  EXPECT_NE(f.get_int("v.f32").error().message.find("has type f32"), std::string::npos);
  EXPECT_NE(f.get_float("general.architecture").error().message.find("has type string"), std::string::npos);
  EXPECT_NE(f.get_int_array("a.str").error().message.find("array[string]"), std::string::npos);
  EXPECT_FALSE(f.get_int_or("v.f32", 1).ok());  // present but wrong: the error, not the default
  EXPECT_FALSE(f.get_bool_or("v.u8", true).ok());
}

TEST(GgufReader, TensorInfosAndData) {
  auto b = rich_file();
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const File& f = *r.value();
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo* e = f.find_tensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, GgmlType::F32);
  EXPECT_EQ(e->n_dims, 2u);
  EXPECT_EQ(e->ne, (std::array<int64_t, 4>{4, 2, 1, 1}));
  EXPECT_EQ(e->n_elements(), 8);
  EXPECT_EQ(e->n_bytes, 32u);
  const TensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_K);
  EXPECT_EQ(q->n_bytes, 144u);
  const TensorInfo* o = f.find_tensor("output.weight");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->n_bytes, 3u * 34u);
  EXPECT_EQ(o->offset, 192u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.data_offset() + 192 + 102, f.file_size());
  EXPECT_EQ(f.tensor_data(*e)[5], 5);    // data bytes were filled with their index
  EXPECT_EQ(f.tensor_data(*o)[0], 7);
  EXPECT_EQ(f.tensor_data(*o)[101], 108);
}

TEST(GgufReader, CustomAlignment) {
  Builder b;
  b.header(2, 1).kv_u32("general.alignment", 64);
  b.tensor("a", {3}, GgmlType::F32, 0).tensor("b", {1}, GgmlType::F16, 64);
  b.pad_to(64).zeros(66);
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value()->alignment(), 64u);
  EXPECT_EQ(r.value()->data_offset() % 64, 0u);
  // the same offsets are not multiples of 128
  Builder c;
  c.header(2, 1).kv_u32("general.alignment", 128);
  c.tensor("a", {3}, GgmlType::F32, 0).tensor("b", {1}, GgmlType::F16, 64);
  c.pad_to(128).zeros(66);
  expect_error(c, {"tensor 'b'", "offset 64", "alignment 128"});
}

TEST(GgufReader, OpenFromDiskBothLoadModes) {
  auto b = rich_file();
  auto path = std::filesystem::path(testing::TempDir()) / "kiln_reader_rich.gguf";
  { std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.b.data()), b.b.size()); }
  for (LoadMode m : {LoadMode::Mmap, LoadMode::Read}) {
    OpenOptions opt;
    opt.load_mode = m;
    auto r = File::open(path.string(), opt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value()->path(), path.string());
    EXPECT_EQ(r.value()->file_size(), b.b.size());
    EXPECT_EQ(r.value()->tensor_data(*r.value()->find_tensor("output.weight"))[1], 8);
  }
  std::filesystem::remove(path);
  auto missing = File::open(path.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(path.string()), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Header-level rejections
// ---------------------------------------------------------------------------------------------

TEST(GgufReader, RejectsBadMagicAndVersions) {
  Builder m;
  m.raw("GGML").put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
  expect_error(m, {"not a GGUF file", "'GGML'"});
  Builder v1;
  v1.header(0, 0, 1);
  expect_error(v1, {"version 1 is not supported"});
  Builder v4;
  v4.header(0, 0, 4);
  expect_error(v4, {"unsupported GGUF version 4"});
  Builder v0;
  v0.header(0, 0, 0);
  expect_error(v0, {"unsupported GGUF version 0"});
  // a big-endian v3 file stores the version as 00 00 00 03
  Builder be;
  be.raw("GGUF").raw(std::string_view("\0\0\0\3", 4)).zeros(16);
  expect_error(be, {"big-endian"});
  Builder tiny;
  tiny.raw("GG");
  expect_error(tiny, {"too short"});
}

TEST(GgufReader, EveryTruncationIsAnError) {
  auto full = rich_file();
  ASSERT_TRUE(parse(full).ok());
  for (size_t n = 0; n < full.b.size(); ++n) {
    Builder cut;
    cut.b.assign(full.b.begin(), full.b.begin() + n);
    auto r = parse(cut);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(r.error().message.rfind("t.gguf: ", 0), 0u) << r.error().message;
  }
}

TEST(GgufReader, RandomMutationsNeverCrash) {
  // Deterministic mini-fuzz (the libFuzzer target in tests/fuzz goes much further under ASan).
  auto base = rich_file();
  std::mt19937_64 rng(12345);
  int ok = 0;
  for (int it = 0; it < 3000; ++it) {
    Builder m = base;
    const int n_flips = 1 + int(rng() % 4);
    for (int k = 0; k < n_flips; ++k) {
      const size_t at = rng() % m.b.size();
      if (rng() % 2) m.b[at] ^= uint8_t(1u << (rng() % 8));
      else m.b[at] = uint8_t(rng());
    }
    auto r = parse(m);
    if (r.ok()) {
      ++ok;
      const File& f = *r.value();
      for (const auto& t : f.tensors()) {  // every tensor lies inside the buffer
        ASSERT_LE(f.data_offset() + t.offset + t.n_bytes, m.b.size()) << t.name;
      }
    } else {
      ASSERT_EQ(r.error().message.rfind("t.gguf: ", 0), 0u);
    }
  }
  EXPECT_GT(ok, 0);  // some mutations only touch tensor data
}

// ---------------------------------------------------------------------------------------------
// Loader-CVE regression classes (docs/gguf.md "Known loader vulnerability classes")
// ---------------------------------------------------------------------------------------------

// Class 1: integer overflow computing tensor byte sizes.
TEST(GgufReaderCve, TensorElementCountOverflow) {
  Builder b;
  b.header(1, 0).tensor("blk.0.ffn_up.weight", {int64_t(1) << 62, int64_t(1) << 62}, GgmlType::F32, 0);
  b.pad_to(32).zeros(64);
  expect_error(b, {"tensor 'blk.0.ffn_up.weight'", "element count"});
}

TEST(GgufReaderCve, TensorByteSizeOverflow) {
  // With the element limit lifted, 2^62 F64 elements are representable but 2^65 bytes are not.
  Limits lim;
  lim.max_tensor_elements = UINT64_MAX;
  Builder b;
  b.header(1, 0).tensor("big", {int64_t(1) << 31, int64_t(1) << 31}, GgmlType::F64, 0);
  b.pad_to(32).zeros(64);
  expect_error(b, {"tensor 'big'", "byte size overflows"}, lim);
  // 2^64 elements never fit TensorInfo::n_elements() (int64), whatever the limit
  Builder c;
  c.header(1, 0).tensor("huge", {int64_t(1) << 32, int64_t(1) << 32}, GgmlType::I8, 0);
  c.pad_to(32).zeros(64);
  expect_error(c, {"tensor 'huge'", "element count"}, lim);
}

TEST(GgufReaderCve, TensorElementLimit) {
  Builder b;
  b.header(1, 0).tensor("w", {int64_t(1) << 21, int64_t(1) << 20}, GgmlType::F32, 0);  // 2^41 > 2^40
  b.pad_to(32).zeros(64);
  expect_error(b, {"tensor 'w'", "exceeds the limit"});
}

// Class 2: string and array lengths beyond the file; huge counts must not allocate.
TEST(GgufReaderCve, KeyLengthBeyondFile) {
  Builder b;
  b.header(0, 1).put<uint64_t>(uint64_t(1) << 60).raw("general.name");
  AllocProbe probe;
  expect_error(b, {"metadata key #0", "string length"});
}

TEST(GgufReaderCve, StringValueLengthBeyondFile) {
  Builder b;
  b.header(0, 1).key("tokenizer.chat_template", ValueType::STRING).put<uint64_t>(1000).raw("{{ x }}");
  AllocProbe probe;
  expect_error(b, {"key 'tokenizer.chat_template'", "string length 1000 exceeds the 7 bytes remaining"});
}

TEST(GgufReaderCve, StringLengthOverLimit) {
  Builder b;
  b.header(0, 1).key("general.name", ValueType::STRING).put<uint64_t>(uint64_t(1) << 62);
  expect_error(b, {"key 'general.name'", "exceeds the limit"});
}

TEST(GgufReaderCve, HugeArrayCountDoesNotAllocate) {
  Builder b;
  b.header(0, 1).arr_hdr("tokenizer.ggml.tokens", ValueType::STRING, uint64_t(1) << 60).str("a");
  AllocProbe probe;
  expect_error(b, {"key 'tokenizer.ggml.tokens'", "array length"});
}

TEST(GgufReaderCve, ArrayCountWithinLimitButBeyondFile) {
  // 2^24 elements pass the count limit; 2^24 u64s need 128 MiB the 50-byte file does not have.
  Builder b;
  b.header(0, 1).arr_hdr("tokenizer.ggml.scores", ValueType::UINT64, uint64_t(1) << 24).zeros(16);
  AllocProbe probe;
  expect_error(b, {"key 'tokenizer.ggml.scores'", "only 16 bytes remain"});
}

TEST(GgufReaderCve, HugeKvAndTensorCounts) {
  Builder kv;
  kv.header(0, uint64_t(1) << 62);
  AllocProbe probe;
  expect_error(kv, {"metadata key count", "exceeds the limit"});
  Builder kv2;  // within the limit but the file is empty: fails on the first key, no big reserve
  kv2.header(0, 60000);
  expect_error(kv2, {"metadata key #0", "truncated"});
  Builder t;
  t.header(uint64_t(1) << 40, 0);
  expect_error(t, {"tensor count", "exceeds the limit"});
  Builder t2;
  t2.header(1000000, 0);
  expect_error(t2, {"tensor #0 name", "truncated"});
}

TEST(GgufReaderCve, MetadataMemoryBudget) {
  // A u8 array expands ~100x in memory (one Value per byte): the budget bounds it.
  Limits lim;
  lim.max_metadata_bytes = 1 << 16;
  Builder b;
  b.header(0, 1).arr_hdr("blob", ValueType::UINT8, 10000).zeros(10000);
  expect_error(b, {"key 'blob'", "memory limit"}, lim);
  EXPECT_TRUE(parse(b).ok());  // the default budget is generous
}

// Class 3: unbounded or wrongly typed general.alignment.
TEST(GgufReaderCve, AlignmentWrongType) {
  Builder u64;
  u64.header(0, 1).key("general.alignment", ValueType::UINT64).put<uint64_t>(32);
  expect_error(u64, {"key 'general.alignment' has type u64, expected u32"});
  Builder s;
  s.header(0, 1).kv_str("general.alignment", "32");
  expect_error(s, {"key 'general.alignment' has type string, expected u32"});
  Builder a;
  a.header(0, 1).arr_hdr("general.alignment", ValueType::UINT32, 1).put<uint32_t>(32);
  expect_error(a, {"key 'general.alignment' has type array[u32], expected u32"});
}

TEST(GgufReaderCve, AlignmentBadValues) {
  for (uint32_t v : {0u, 3u, 48u, 0x80000000u, 1u << 17}) {
    Builder b;
    b.header(0, 1).kv_u32("general.alignment", v);
    expect_error(b, {"key 'general.alignment'", std::to_string(v)});
  }
  Builder one;  // 1 is a power of two: packed data, accepted
  one.header(0, 1).kv_u32("general.alignment", 1);
  EXPECT_TRUE(parse(one).ok());
}

// Class 4: tensor data offsets outside the file.
TEST(GgufReaderCve, TensorDataBeyondFile) {
  Builder b;
  b.header(1, 0).tensor("output.weight", {64}, GgmlType::F32, 0);
  b.pad_to(32).zeros(255);  // one byte short of 256
  expect_error(b, {"tensor 'output.weight'", "beyond the end"});
}

TEST(GgufReaderCve, TensorOffsetFarOutside) {
  Builder b;
  b.header(1, 0).tensor("x", {8}, GgmlType::F32, uint64_t(1) << 40);
  b.pad_to(32).zeros(32);
  expect_error(b, {"tensor 'x'", "beyond the end"});
}

TEST(GgufReaderCve, TensorOffsetPlusSizeWraps) {
  Builder b;
  b.header(1, 0).tensor("wrap", {64}, GgmlType::F32, UINT64_MAX - 31);  // aligned, offset + 256 wraps
  b.pad_to(32).zeros(32);
  expect_error(b, {"tensor 'wrap'", "beyond the end"});
}

TEST(GgufReaderCve, DataSectionBeyondFile) {
  Builder b;
  b.header(1, 0).tensor("x", {1}, GgmlType::F32, 0);  // no padding, no data
  expect_error(b, {"tensor 'x'"});
}

TEST(GgufReaderCve, OverlappingTensors) {
  Builder b;
  b.header(2, 0).tensor("a", {16}, GgmlType::F32, 0).tensor("b", {8}, GgmlType::F32, 32);
  b.pad_to(32).zeros(64);
  expect_error(b, {"'a'", "'b'", "overlap"});
}

TEST(GgufReaderCve, UnalignedTensorOffset) {
  Builder b;
  b.header(1, 0).tensor("x", {4}, GgmlType::F32, 4);
  b.pad_to(32).zeros(64);
  expect_error(b, {"tensor 'x'", "not a multiple of the alignment 32"});
}

// Class 5: duplicate tensor names (and duplicate keys).
TEST(GgufReaderCve, DuplicateTensorNames) {
  Builder b;
  b.header(2, 0).tensor("blk.0.attn_k.weight", {8}, GgmlType::F32, 0).tensor("blk.0.attn_k.weight", {8}, GgmlType::F32, 32);
  b.pad_to(32).zeros(64);
  expect_error(b, {"duplicate tensor name 'blk.0.attn_k.weight'"});
}

TEST(GgufReaderCve, DuplicateKeys) {
  Builder b;
  b.header(0, 2).kv_u32("llama.block_count", 2).kv_u32("llama.block_count", 200);
  expect_error(b, {"duplicate metadata key 'llama.block_count'"});
}

// ---------------------------------------------------------------------------------------------
// Other structural checks
// ---------------------------------------------------------------------------------------------

TEST(GgufReader, RejectsBadDims) {
  for (uint32_t nd : {0u, 5u}) {
    Builder b;
    b.header(1, 0).str("t0").put<uint32_t>(nd);
    for (uint32_t k = 0; k < nd; ++k) b.put<int64_t>(1);
    b.put<uint32_t>(0).put<uint64_t>(0).pad_to(32).zeros(32);
    expect_error(b, {"tensor 't0'", "n_dims is " + std::to_string(nd)});
  }
  for (int64_t d : {int64_t(0), int64_t(-1), INT64_MIN}) {
    Builder b;
    b.header(1, 0).tensor("t1", {4, d}, GgmlType::F32, 0).pad_to(32).zeros(64);
    expect_error(b, {"tensor 't1'", "dimension 1 is " + std::to_string(d)});
  }
}

TEST(GgufReader, RejectsUnknownTensorType) {
  for (uint32_t id : {4u, 5u, 31u, 40u, 1000u}) {
    Builder b;
    b.header(1, 0).str("weird").put<uint32_t>(1).put<int64_t>(32).put<uint32_t>(id).put<uint64_t>(0);
    b.pad_to(32).zeros(256);
    expect_error(b, {"tensor 'weird'", "unknown ggml type id " + std::to_string(id)});
  }
}

TEST(GgufReader, RejectsRowNotMultipleOfBlock) {
  Builder b;
  b.header(1, 0).tensor("q", {100, 2}, GgmlType::Q4_K, 0).pad_to(32).zeros(1024);
  expect_error(b, {"tensor 'q'", "ne[0] = 100", "Q4_K block size 256"});
}

TEST(GgufReader, RejectsBadNames) {
  Builder empty_key;
  empty_key.header(0, 1).kv_u32("", 1);
  expect_error(empty_key, {"metadata key #0 is an empty string"});
  Builder bad_utf8;
  bad_utf8.header(0, 1).kv_u32("gen\xc3(", 1);
  expect_error(bad_utf8, {"metadata key #0", "not valid UTF-8"});
  Builder overlong;  // overlong encoding of '/'
  overlong.header(0, 1).kv_u32("a\xc0\xaf", 1);
  expect_error(overlong, {"not valid UTF-8"});
  Builder utf8_ok;
  utf8_ok.header(0, 1).kv_u32("clé.名前", 1);
  EXPECT_TRUE(parse(utf8_ok).ok());
  Builder empty_tensor;
  empty_tensor.header(1, 0).tensor("", {1}, GgmlType::F32, 0).pad_to(32).zeros(32);
  expect_error(empty_tensor, {"tensor #0 name is an empty string"});
  Builder long_tensor;
  long_tensor.header(1, 0).tensor(std::string(64, 'x'), {1}, GgmlType::F32, 0).pad_to(32).zeros(32);
  expect_error(long_tensor, {"name is 64 bytes"});
  Builder max_tensor;
  max_tensor.header(1, 0).tensor(std::string(63, 'x'), {1}, GgmlType::F32, 0).pad_to(32).zeros(32);
  EXPECT_TRUE(parse(max_tensor).ok());
}

TEST(GgufReader, RejectsBadValueTypes) {
  Builder t;
  t.header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
  expect_error(t, {"key 'k' has invalid value type 13"});
  Builder et;
  et.header(0, 1).arr_hdr("k2", ValueType(99), 1).zeros(8);
  expect_error(et, {"key 'k2'", "invalid array element type 99"});
  Builder bo;
  bo.header(0, 1).key("k3", ValueType::BOOL).put<uint8_t>(2);
  expect_error(bo, {"key 'k3'", "bool value is 2"});
}

TEST(GgufReader, ArrayNestingLimit) {
  // depth 4 (the default limit) parses; depth 5 does not
  auto nested = [](int depth) {
    Builder b;
    b.header(0, 1).key("deep", ValueType::ARRAY);
    for (int d = 1; d < depth; ++d) b.put<uint32_t>(uint32_t(ValueType::ARRAY)).put<uint64_t>(1);
    b.put<uint32_t>(uint32_t(ValueType::UINT8)).put<uint64_t>(1).put<uint8_t>(9);
    return b;
  };
  auto ok = parse(nested(4));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok.value()->find("deep")->arr[0].arr[0].arr[0].arr[0].u, 9u);
  expect_error(nested(5), {"key 'deep'", "nested deeper than the limit 4"});
  Builder bomb;  // 2^20 nested-array headers: each level bounded by the bytes left
  bomb.header(0, 1).arr_hdr("bomb", ValueType::ARRAY, uint64_t(1) << 20).put<uint32_t>(0).put<uint64_t>(0);
  expect_error(bomb, {"key 'bomb'"});
}

// ---------------------------------------------------------------------------------------------
// Performance: a 5 GB (sparse) file opens in milliseconds; a 150k-entry vocabulary parses fast.
// ---------------------------------------------------------------------------------------------

TEST(GgufReader, OpensHugeSparseFileQuickly) {
  // 20 tensors of 256 MiB (F16 [8192, 16384]) -> 5 GiB of tensor data, never touched.
  const int n = 20;
  const uint64_t tbytes = uint64_t(8192) * 16384 * 2;
  Builder b;
  b.header(n, 1).kv_str("general.architecture", "llama");
  for (int i = 0; i < n; ++i) b.tensor(fmt::format("blk.{}.ffn_up.weight", i), {8192, 16384}, GgmlType::F16, i * tbytes);
  b.pad_to(32);
  const uint64_t total = b.b.size() + n * tbytes;
  auto path = std::filesystem::path(testing::TempDir()) / "kiln_reader_sparse.gguf";
  {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.b.data()), b.b.size());
    std::filesystem::resize_file(path, total);  // sparse: no disk blocks for the data
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = File::open(path.string());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value()->file_size(), total);
  EXPECT_EQ(r.value()->tensors().size(), size_t(n));
  EXPECT_LT(ms, 200.0) << "opening a 5 GiB file must not touch tensor data";
  std::printf("opened a %.1f GiB file in %.2f ms\n", total / double(1ull << 30), ms);
}

// ---------------------------------------------------------------------------------------------
// Real files: llama.cpp's vocabulary GGUFs (../shared/data/vocab)
// ---------------------------------------------------------------------------------------------

namespace {
std::filesystem::path shared_data() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return std::filesystem::path(src ? src : KILN_SOURCE_DIR) / ".." / "shared" / "data";
}
}  // namespace

TEST(GgufReaderReal, VocabFiles) {
  const auto dir = shared_data() / "vocab";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "shared test data not found at " << dir;
  int seen = 0;
  for (const char* v : {"qwen35", "qwen2", "llama-bpe", "llama-spm"}) {
    const auto path = dir / (std::string("ggml-vocab-") + v + ".gguf");
    if (!std::filesystem::exists(path)) continue;
    ++seen;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = File::open(path.string());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r.ok()) << r.error().message;
    const File& f = *r.value();
    EXPECT_EQ(f.version(), 3u) << path;
    auto arch = f.get_string("general.architecture");
    ASSERT_TRUE(arch.ok()) << arch.error().message;
    auto model = f.get_string("tokenizer.ggml.model");
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ(model.value(), std::string(v) == "llama-spm" ? "llama" : "gpt2") << path;
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.error().message;
    const size_t n_vocab = tokens.value().size();
    EXPECT_GT(n_vocab, 30000u);
    // token_type (and scores when present) run parallel to tokens
    auto types = f.get_int_array("tokenizer.ggml.token_type");
    ASSERT_TRUE(types.ok()) << types.error().message;
    EXPECT_EQ(types.value().size(), n_vocab);
    if (f.has("tokenizer.ggml.scores")) {
      EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").value().size(), n_vocab);
    }
    // the expected-ids file from llama.cpp must index into this vocabulary
    std::ifstream out(path.string() + ".out");
    int64_t id = 0, max_id = -1;
    while (out >> id) max_id = std::max(max_id, id);
    EXPECT_GE(max_id, 0);
    EXPECT_LT(max_id, int64_t(n_vocab)) << path;
    EXPECT_LT(ms, 2000.0) << path << ": parsing " << n_vocab << " tokens took " << ms << " ms";
    std::printf("%s: %zu tokens, %zu keys, %zu tensors, parsed in %.1f ms\n", path.filename().c_str(), n_vocab,
                f.metadata().size(), f.tensors().size(), ms);
  }
  if (seen == 0) GTEST_SKIP() << "no vocab files in " << dir;
}
