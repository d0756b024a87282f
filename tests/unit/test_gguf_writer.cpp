// GGUF writer -> reader round trip: every metadata value type (nested arrays included), the
// alignment key and padding, tensor infos and streamed tensor data. The oracle is kiln's own
// reader (written independently from the format spec) plus byte-level checks of the layout;
// tests/py/test_gen_llamacpp.py additionally reads generated files with the `gguf` package.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "gguf/writer.h"

namespace kiln::gguf {
namespace {

std::string tmp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_test_gguf_writer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(GgufWriter, EveryValueTypeRoundTrips) {
  Writer w;
  w.set("t.u8", make_u8(250));
  w.set("t.i8", make_i8(-100));
  w.set("t.u16", make_u16(65000));
  w.set("t.i16", make_i16(-32000));
  w.set("t.u32", make_u32(4000000000u));
  w.set("t.i32", make_i32(-2000000000));
  w.set("t.u64", make_u64(0xfedcba9876543210ull));
  w.set("t.i64", make_i64(std::numeric_limits<int64_t>::min() + 7));
  w.set("t.f32", make_f32(3.25f));
  w.set("t.f64", make_f64(-1.0 / 3.0));
  w.set("t.bool_t", make_bool(true));
  w.set("t.bool_f", make_bool(false));
  w.set("t.str", make_string(std::string("h\xc3\xa9llo\0world", 12)));
  w.set("t.empty_str", make_string(""));
  w.set("t.arr_str", make_string_array({"a", "", "b c"}));
  w.set("t.arr_i32", make_i32_array({1, -2, 3}));
  w.set("t.arr_u32", make_u32_array({7, 8}));
  w.set("t.arr_f32", make_f32_array({0.5f, -1.5f}));
  w.set("t.arr_bool", make_bool_array({true, false, true}));
  w.set("t.arr_empty", make_array(ValueType::INT64, {}));
  w.set("t.arr_u8", make_array(ValueType::UINT8, {make_u8(1), make_u8(255)}));
  w.set("t.arr_f64", make_array(ValueType::FLOAT64, {make_f64(1e300)}));
  w.set("t.nested", make_array(ValueType::ARRAY, {make_i32_array({1, 2}), make_i32_array({}),
                                                  make_array(ValueType::ARRAY, {make_string_array({"deep"})})}));
  w.set("t.replaced", make_u32(1));
  w.set("t.replaced", make_string("second"));  // replaces in place, keeps its position
  const std::string p = tmp_path("values.gguf");
  ASSERT_TRUE(w.write(p).ok());

  auto fr = File::open(p);
  ASSERT_TRUE(fr.ok()) << fr.error().message;
  const File& f = **fr;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_FALSE(f.has("general.alignment"));  // default alignment: key not written
  ASSERT_EQ(f.metadata().size(), w.metadata().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) EXPECT_EQ(f.metadata()[i].key, w.metadata()[i].key);

  auto type_of = [&](const char* k) { return f.find(k)->type; };
  EXPECT_EQ(type_of("t.u8"), ValueType::UINT8);
  EXPECT_EQ(f.find("t.u8")->u, 250u);
  EXPECT_EQ(type_of("t.i8"), ValueType::INT8);
  EXPECT_EQ(f.find("t.i8")->i, -100);
  EXPECT_EQ(type_of("t.u16"), ValueType::UINT16);
  EXPECT_EQ(f.find("t.u16")->u, 65000u);
  EXPECT_EQ(type_of("t.i16"), ValueType::INT16);
  EXPECT_EQ(f.find("t.i16")->i, -32000);
  EXPECT_EQ(type_of("t.u32"), ValueType::UINT32);
  EXPECT_EQ(f.find("t.u32")->u, 4000000000u);
  EXPECT_EQ(type_of("t.i32"), ValueType::INT32);
  EXPECT_EQ(f.find("t.i32")->i, -2000000000);
  EXPECT_EQ(type_of("t.u64"), ValueType::UINT64);
  EXPECT_EQ(f.find("t.u64")->u, 0xfedcba9876543210ull);
  EXPECT_EQ(type_of("t.i64"), ValueType::INT64);
  EXPECT_EQ(f.find("t.i64")->i, std::numeric_limits<int64_t>::min() + 7);
  EXPECT_EQ(type_of("t.f32"), ValueType::FLOAT32);
  EXPECT_EQ(f.find("t.f32")->f, 3.25);
  EXPECT_EQ(type_of("t.f64"), ValueType::FLOAT64);
  EXPECT_EQ(f.find("t.f64")->f, -1.0 / 3.0);
  EXPECT_TRUE(f.find("t.bool_t")->b);
  EXPECT_FALSE(f.find("t.bool_f")->b);
  EXPECT_EQ(f.find("t.str")->str, std::string("h\xc3\xa9llo\0world", 12));
  EXPECT_EQ(f.find("t.empty_str")->str, "");
  EXPECT_EQ(f.get_string_array("t.arr_str").value(), (std::vector<std::string>{"a", "", "b c"}));
  EXPECT_EQ(f.get_int_array("t.arr_i32").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.find("t.arr_u32")->elem_type, ValueType::UINT32);
  EXPECT_EQ(f.get_int_array("t.arr_u32").value(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(f.get_float_array("t.arr_f32").value(), (std::vector<double>{0.5, -1.5}));
  const Value* ab = f.find("t.arr_bool");
  ASSERT_EQ(ab->arr.size(), 3u);
  EXPECT_EQ(ab->elem_type, ValueType::BOOL);
  EXPECT_TRUE(ab->arr[0].b);
  EXPECT_FALSE(ab->arr[1].b);
  EXPECT_TRUE(ab->arr[2].b);
  EXPECT_EQ(f.find("t.arr_empty")->elem_type, ValueType::INT64);
  EXPECT_TRUE(f.find("t.arr_empty")->arr.empty());
  EXPECT_EQ(f.find("t.arr_u8")->arr.at(1).u, 255u);
  EXPECT_EQ(f.find("t.arr_f64")->arr.at(0).f, 1e300);
  const Value* n = f.find("t.nested");
  ASSERT_EQ(n->elem_type, ValueType::ARRAY);
  ASSERT_EQ(n->arr.size(), 3u);
  EXPECT_EQ(n->arr[0].arr.size(), 2u);
  EXPECT_EQ(n->arr[0].arr[1].i, 2);
  EXPECT_TRUE(n->arr[1].arr.empty());
  EXPECT_EQ(n->arr[2].arr[0].arr[0].str, "deep");
  EXPECT_EQ(f.get_string("t.replaced").value(), "second");
  EXPECT_TRUE(f.tensors().empty());
}

// Deterministic bytes for tensor t, row r: lets the test check every streamed byte.
uint8_t pattern(int t, int64_t byte) { return static_cast<uint8_t>((byte * 131 + t * 17 + (byte >> 8)) & 0xff); }

TEST(GgufWriter, TensorsAlignedAndStreamedInChunks) {
  for (uint32_t align : {32u, 64u, 4096u}) {
    Writer w(align);
    w.set_string("general.architecture", "test");
    w.set_chunk_bytes(100);  // force many RowFill calls, including one row per chunk for big rows
    struct Spec {
      std::string name;
      GgmlType type;
      std::vector<int64_t> ne;
    };
    const std::vector<Spec> specs = {
        {"a.f32", GgmlType::F32, {3}},                 // 12 bytes: the next offset needs padding
        {"b.f16", GgmlType::F16, {5, 7}},              // 70 bytes
        {"c.q8_0", GgmlType::Q8_0, {64, 3, 2}},        // 2 blocks/row * 34 * 6 rows
        {"d.q4_k", GgmlType::Q4_K, {256, 2, 1, 2}},    // 4-D
        {"e.bf16", GgmlType::BF16, {1}},
    };
    std::vector<int64_t> calls(specs.size(), 0);
    for (size_t ti = 0; ti < specs.size(); ++ti) {
      const auto& s = specs[ti];
      auto st = w.add_tensor(s.name, s.type, s.ne, [&, ti](int64_t row0, int64_t n_rows, uint8_t* dst) {
        const auto& e = w.tensors()[ti];
        EXPECT_EQ(static_cast<int64_t>(e.row_bytes * row0), calls[ti]) << "rows must come in order";
        for (uint64_t b = 0; b < e.row_bytes * n_rows; ++b) dst[b] = pattern(int(ti), int64_t(e.row_bytes * row0 + b));
        calls[ti] += int64_t(e.row_bytes * n_rows);
      });
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
    const std::string p = tmp_path("tensors_" + std::to_string(align) + ".gguf");
    ASSERT_TRUE(w.write(p).ok());

    auto fr = File::open(p);
    ASSERT_TRUE(fr.ok()) << fr.error().message;
    const File& f = **fr;
    EXPECT_EQ(f.alignment(), align);
    if (align != 32) {
      EXPECT_EQ(f.get_uint("general.alignment").value(), align);
    }
    EXPECT_EQ(f.data_offset() % align, 0u);
    EXPECT_EQ(f.file_size() % align, 0u) << "file ends padded to the alignment";
    ASSERT_EQ(f.tensors().size(), specs.size());
    for (size_t ti = 0; ti < specs.size(); ++ti) {
      const auto& s = specs[ti];
      const TensorInfo& t = f.tensors()[ti];
      EXPECT_EQ(t.name, s.name);
      EXPECT_EQ(t.type, s.type);
      EXPECT_EQ(t.n_dims, s.ne.size());
      for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < s.ne.size() ? s.ne[d] : 1) << s.name << " dim " << d;
      EXPECT_EQ(t.offset % align, 0u) << s.name;
      const auto& ti_ = type_info(s.type);
      const uint64_t expect_bytes = uint64_t(t.n_elements() / ti_.block_size) * ti_.type_size;
      EXPECT_EQ(t.n_bytes, expect_bytes);
      EXPECT_EQ(calls[ti], int64_t(expect_bytes)) << "every row filled exactly once";
      const uint8_t* d = f.tensor_data(t);
      int64_t bad = 0;
      for (uint64_t b = 0; b < t.n_bytes; ++b) bad += d[b] != pattern(int(ti), int64_t(b));
      EXPECT_EQ(bad, 0) << s.name;
    }
    // Padding between tensors is zero.
    auto bytes = read_all(p);
    for (size_t ti = 0; ti + 1 < f.tensors().size(); ++ti) {
      const auto& t = f.tensors()[ti];
      for (uint64_t o = f.data_offset() + t.offset + t.n_bytes; o < f.data_offset() + f.tensors()[ti + 1].offset; ++o)
        ASSERT_EQ(bytes[o], 0) << "padding after " << t.name;
    }
  }
}

TEST(GgufWriter, HeaderBytesFollowTheFormat) {
  // Independent byte-level check of the first fields (GGUF v3 spec): magic, version, counts,
  // first key as (u64 len, bytes), value type u32, value.
  Writer w;
  w.set_u32("k", 0x01020304);
  const std::string p = tmp_path("header.gguf");
  ASSERT_TRUE(w.write(p).ok());
  auto b = read_all(p);
  const std::vector<uint8_t> expect = {'G', 'G', 'U', 'F', 3, 0, 0, 0,  // magic, version 3
                                       0, 0, 0, 0, 0, 0, 0, 0,          // tensor count
                                       1, 0, 0, 0, 0, 0, 0, 0,          // kv count
                                       1, 0, 0, 0, 0, 0, 0, 0, 'k',     // key
                                       4, 0, 0, 0,                      // UINT32
                                       4, 3, 2, 1};
  ASSERT_GE(b.size(), expect.size());
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + expect.size()), expect);
}

TEST(GgufWriter, BadTensorsAreErrors) {
  Writer w;
  const int64_t ok_ne[] = {32, 2};
  ASSERT_TRUE(w.add_tensor("x", GgmlType::Q8_0, ok_ne, nullptr).ok());
  auto dup = w.add_tensor("x", GgmlType::F32, ok_ne, nullptr);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("'x'"), std::string::npos);
  const int64_t bad_block[] = {33, 2};
  auto bb = w.add_tensor("y", GgmlType::Q8_0, bad_block, nullptr);
  ASSERT_FALSE(bb.ok());
  EXPECT_NE(bb.error().message.find("'y'"), std::string::npos);
  const int64_t zero[] = {4, 0};
  EXPECT_FALSE(w.add_tensor("z", GgmlType::F32, zero, nullptr).ok());
  const int64_t five[] = {1, 1, 1, 1, 1};
  EXPECT_FALSE(w.add_tensor("w", GgmlType::F32, five, nullptr).ok());
  const uint8_t three[3] = {1, 2, 3};
  const int64_t four[] = {1};
  EXPECT_FALSE(w.add_tensor_bytes("v", GgmlType::F32, four, three).ok());
  EXPECT_EQ(w.tensors().size(), 1u);
  const float one = 1.0f;
  ASSERT_TRUE(w.add_tensor_bytes("u", GgmlType::F32, four, {reinterpret_cast<const uint8_t*>(&one), 4}).ok());
  EXPECT_EQ(w.tensors()[1].offset, 96u);  // 68 bytes of Q8_0 rounded up to 32
  EXPECT_FALSE(w.write("/nonexistent-dir/x.gguf").ok());
}

}  // namespace
}  // namespace kiln::gguf

// ---- the generator (model/gen) writes through the Writer; check its files with the reader ----
#include "model/gen/gen.h"
#include "tensor/quant.h"

namespace kiln::model::gen {
namespace {

TEST(GgufGen, TinyPresetsMatchThePlanAndTheVocab) {
  for (const char* preset : {"tiny-llama", "tiny-qwen3", "tiny-qwen35", "tiny-qwen35moe"}) {
    GenOptions o;
    o.spec = find_preset(preset)->spec;
    o.type = gguf::GgmlType::F32;
    o.n_threads = 2;
    if (o.spec.arch == "qwen35") o.spec.n_mtp = 1;
    auto pl = plan(o);
    ASSERT_TRUE(pl.ok()) << pl.error().message;
    const std::string p = gguf::tmp_path(std::string(preset) + ".gguf");
    auto st = generate(o, p);
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto fr = gguf::File::open(p);
    ASSERT_TRUE(fr.ok()) << fr.error().message;
    const gguf::File& f = **fr;
    ASSERT_EQ(f.tensors().size(), pl->size()) << preset;
    for (size_t i = 0; i < pl->size(); ++i) {
      const auto& t = f.tensors()[i];
      EXPECT_EQ(t.name, (*pl)[i].name);
      EXPECT_EQ(t.n_bytes, (*pl)[i].n_bytes);
      ASSERT_EQ(t.type, gguf::GgmlType::F32);
      const float* x = reinterpret_cast<const float*>(f.tensor_data(t));
      for (int64_t k = 0; k < t.n_elements(); ++k) ASSERT_TRUE(std::isfinite(x[k])) << t.name;
    }
    const std::string a = o.spec.arch;
    EXPECT_EQ(f.get_string("general.architecture").value(), a);
    auto toks = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(toks.ok());
    EXPECT_EQ(int64_t(toks->size()), f.find_tensor("token_embd.weight")->ne[1]);
    EXPECT_EQ(int64_t(toks->size()), o.spec.n_vocab);
    EXPECT_EQ(f.get_int(a + ".block_count").value(), o.spec.n_layer + o.spec.n_mtp);
    EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->size(), toks->size());
    if (a == "qwen35") {
      EXPECT_EQ(f.get_int("qwen35.nextn_predict_layers").value(), 1);
      const auto* t = f.find_tensor("blk.0.ssm_a");
      ASSERT_NE(t, nullptr);
      const float* x = reinterpret_cast<const float*>(f.tensor_data(*t));
      for (int64_t k = 0; k < t->n_elements(); ++k) EXPECT_LT(x[k], 0.0f);
      EXPECT_NE(f.find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
    }
  }
}

TEST(GgufGen, SameSeedSameBytesAnyThreadCount) {
  GenOptions o;
  o.spec = find_preset("tiny-qwen35")->spec;
  o.type = gguf::GgmlType::F16;
  o.n_threads = 1;
  const std::string a = gguf::tmp_path("seed-a.gguf"), b = gguf::tmp_path("seed-b.gguf"),
                    c = gguf::tmp_path("seed-c.gguf");
  ASSERT_TRUE(generate(o, a).ok());
  o.n_threads = 3;
  ASSERT_TRUE(generate(o, b).ok());
  o.seed = 43;
  ASSERT_TRUE(generate(o, c).ok());
  EXPECT_EQ(gguf::read_all(a), gguf::read_all(b));
  EXPECT_NE(gguf::read_all(a), gguf::read_all(c));
}

// --fast: the same tensor table and sizes; a tensor's first 64 rows are the normal file's, and every
// block of a later row is the block at the same column of one of them; deterministic across threads.
TEST(GgufGen, FastWeightsAreBlocksOfThePoolRows) {
  GenOptions o;
  o.spec = find_preset("tiny-qwen35")->spec;
  o.type = gguf::GgmlType::Q8_0;
  o.n_threads = 2;
  const std::string slow = gguf::tmp_path("fast-0.gguf"), fa = gguf::tmp_path("fast-1.gguf"),
                    fb = gguf::tmp_path("fast-2.gguf");
  ASSERT_TRUE(generate(o, slow).ok());
  o.fast = true;
  ASSERT_TRUE(generate(o, fa).ok());
  o.n_threads = 3;
  ASSERT_TRUE(generate(o, fb).ok());
  EXPECT_EQ(gguf::read_all(fa), gguf::read_all(fb));
  EXPECT_NE(gguf::read_all(fa), gguf::read_all(slow));
  auto s = gguf::File::open(slow), f = gguf::File::open(fa);
  ASSERT_TRUE(s.ok() && f.ok());
  ASSERT_EQ((*s)->tensors().size(), (*f)->tensors().size());
  int checked = 0;
  for (size_t i = 0; i < (*f)->tensors().size(); ++i) {
    const auto& ts = (*s)->tensors()[i];
    const auto& tf = (*f)->tensors()[i];
    ASSERT_EQ(ts.name, tf.name);
    ASSERT_EQ(ts.type, tf.type);
    ASSERT_EQ(ts.ne, tf.ne);
    const size_t rb = tensor::row_size(tf.type, tf.ne[0]), blk = gguf::type_info(tf.type).type_size;
    int64_t rows = 1;
    for (size_t d = 1; d < tf.ne.size(); ++d) rows *= tf.ne[d];
    const uint8_t *ps = (*s)->tensor_data(ts), *pf = (*f)->tensor_data(tf);
    const int64_t pool = std::min<int64_t>(rows, kFastPoolRows);
    EXPECT_EQ(std::memcmp(ps, pf, size_t(pool) * rb), 0) << tf.name << ": the pool rows";
    if (rows <= kFastPoolRows) continue;
    ++checked;
    int64_t bad = 0, differ = 0;
    for (int64_t r = kFastPoolRows; r < rows; ++r)
      for (size_t c = 0; c < rb; c += blk) {
        bool found = false;
        for (int64_t q = 0; q < kFastPoolRows && !found; ++q) found = std::memcmp(pf + size_t(r) * rb + c, pf + size_t(q) * rb + c, blk) == 0;
        bad += !found;
        differ += std::memcmp(pf + size_t(r) * rb, pf + size_t(r - 1) * rb, rb) != 0 && c == 0;
      }
    EXPECT_EQ(bad, 0) << tf.name << ": blocks not taken from the pool rows";
    EXPECT_GT(differ, (rows - kFastPoolRows) / 2) << tf.name << ": rows repeat";
  }
  EXPECT_GT(checked, 3);  // token_embd and the wider matrices
}

TEST(GgufGen, InvalidSpecsAreErrorsNamingTheField) {
  GenOptions o;
  o.spec = find_preset("tiny-qwen35")->spec;
  o.spec.ssm_n_group = 3;  // Hv = 4 is not a multiple
  auto r = plan(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("ssm_n_group"), std::string::npos);
  o.spec = find_preset("tiny-llama")->spec;
  o.spec.n_vocab = 10;
  r = plan(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("n_vocab"), std::string::npos);
  auto v = build_vocabulary("qwen35", 300);
  EXPECT_FALSE(v.ok());
}

}  // namespace
}  // namespace kiln::model::gen
