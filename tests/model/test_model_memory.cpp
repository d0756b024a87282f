// Internal consistency of the forward passes and sequence memory, on tiny generated models of every
// architecture (F32 weights, F32 and Q8_0 KV):
//  - chunked prefill (one batch, chunks of 7) = token-by-token decode;
//  - chunked gated-delta prefill = recurrent form (qwen35*);
//  - snapshot -> other tokens -> restore -> continue = uninterrupted run;
//  - seq_copy then continue = the source continued;
//  - two sequences in one batch (a prefill chunk and a decode token at different positions) = each alone;
//  - batch validation errors (position gaps, wrong start, unknown token).
// The oracle is the model itself run the simple way (one token at a time, one sequence).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "model/context.h"
#include "gguf/writer.h"
#include "model/gen/gen.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"

namespace kiln::model {
namespace {

namespace fs = std::filesystem;

std::string model_path(const std::string& arch) {
  return test::generated_model("kiln_test_model_memory", "tiny-" + arch, gguf::GgmlType::F32, 7);
}
using test::random_tokens;

using Logits = std::vector<std::vector<float>>;

// Runs toks on sequence seq from the memory's current position, in batches of `chunk`; returns all logits.
Logits run(Context& cx, Memory& mem, int seq, const std::vector<int32_t>& toks, int64_t chunk) {
  Logits out;
  const int64_t V = cx.model().config().n_vocab;
  for (size_t i = 0; i < toks.size(); i += size_t(chunk)) {
    Batch b;
    const size_t n = std::min(toks.size() - i, size_t(chunk));
    b.add_run(std::span(toks.data() + i, n), int32_t(mem.seq_pos(seq)), seq, true);
    auto st = cx.decode(b, mem);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return out;
    for (int64_t r = 0; r < cx.n_outputs(); ++r) out.emplace_back(cx.logits(r), cx.logits(r) + V);
  }
  return out;
}

float max_diff(const Logits& a, const Logits& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) m = std::max(m, std::fabs(a[i][j] - b[i][j]));
  return m;
}

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> cx;
  explicit Fixture(const std::string& arch, int delta_chunk_min = 0) {
    auto m = load_model(model_path(arch));
    KILN_CHECK(m.ok(), "{}", m.ok() ? "" : m.error().message);
    model = std::move(*m);
    ContextOptions co;
    co.n_batch = 64;
    co.n_threads = 2;
    co.delta_chunk_min = delta_chunk_min;
    cx = std::make_unique<Context>(*model, co);
  }
  std::unique_ptr<Memory> memory(int n_seq, GgmlType kv = GgmlType::F32) {
    MemoryOptions mo;
    mo.n_ctx = 128;
    mo.n_seq = n_seq;
    mo.type_k = mo.type_v = kv;
    auto m = Memory::create(model->config(), mo);
    KILN_CHECK(m.ok(), "memory");
    return std::move(*m);
  }
};

class ModelMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelMemory, ChunkedPrefillEqualsTokenByToken) {
  Fixture f(GetParam());
  const auto toks = random_tokens(40, f.model->config().n_vocab, 1);
  for (GgmlType kv : {GgmlType::F32, GgmlType::Q8_0}) {
    auto m1 = f.memory(1, kv), m2 = f.memory(1, kv);
    const Logits one = run(*f.cx, *m1, 0, toks, 1);
    const Logits chunked = run(*f.cx, *m2, 0, toks, 7);
    ASSERT_EQ(one.size(), toks.size());
    EXPECT_LT(max_diff(one, chunked), 2e-4) << gguf::type_name(kv);
    EXPECT_EQ(m2->seq_pos(0), 40);
  }
}

// Only the hybrid architectures have delta-net layers (instantiated for them below).
class HybridMemory : public ModelMemory {};

TEST_P(HybridMemory, ChunkedDeltaRuleEqualsRecurrent) {
  Fixture rec(GetParam(), 0), chk(GetParam(), 8);
  const auto toks = random_tokens(50, rec.model->config().n_vocab, 2);
  auto m1 = rec.memory(1), m2 = chk.memory(1);
  const Logits a = run(*rec.cx, *m1, 0, toks, 25);
  const Logits b = run(*chk.cx, *m2, 0, toks, 25);
  EXPECT_LT(max_diff(a, b), 2e-3);
}

// Spare recurrent state slots (MemoryOptions::n_rec_cache, the prefix cache's first tier): a state
// saved there, restored into a sequence after a detour (with the KV rows it needs) continues like the
// uninterrupted run; read to the host it equals what read_rec gave when it was saved.
TEST_P(HybridMemory, SpareStateSlotsSaveAndLoad) {
  Fixture f(GetParam());
  const int64_t V = f.model->config().n_vocab;
  const auto prefix = random_tokens(20, V, 13), cont = random_tokens(12, V, 14), detour = random_tokens(9, V, 15);
  auto ref_mem = f.memory(1);
  run(*f.cx, *ref_mem, 0, prefix, 8);
  const Logits ref = run(*f.cx, *ref_mem, 0, cont, 5);

  MemoryOptions mo;
  mo.n_ctx = 128;
  mo.n_seq = 2;
  mo.type_k = mo.type_v = GgmlType::F32;
  mo.n_rec_cache = 3;
  auto mem = Memory::create(f.model->config(), mo);
  ASSERT_TRUE(mem.ok());
  Memory& m = **mem;
  EXPECT_EQ(m.n_rec_cache(), 3);
  run(*f.cx, m, 0, prefix, 8);
  std::vector<float> at_prefix(m.rec_floats()), spare(m.rec_floats());
  m.read_rec(0, at_prefix.data());
  m.rec_save(0, 2);
  std::vector<uint8_t> kv(size_t(20) * m.kv_bytes_per_pos());
  m.read_kv(0, 0, 20, kv.data());
  run(*f.cx, m, 0, detour, 4);
  m.read_rec_cache(2, spare.data());
  EXPECT_EQ(spare, at_prefix);
  // Into the other sequence: its KV rows from the host, the state by a copy from the spare slot.
  m.write_kv(1, 0, kv.data(), 20, 0, 20);
  m.rec_load(2, 1);
  m.set_seq_pos(1, 20);
  EXPECT_EQ(max_diff(run(*f.cx, m, 1, cont, 5), ref), 0.f);
}

TEST_P(ModelMemory, SnapshotRestoreContinueEqualsUninterrupted) {
  Fixture f(GetParam());
  const int64_t V = f.model->config().n_vocab;
  const auto prefix = random_tokens(20, V, 3), cont = random_tokens(12, V, 4), detour = random_tokens(9, V, 5);
  auto ref_mem = f.memory(1);
  run(*f.cx, *ref_mem, 0, prefix, 8);
  const Logits ref = run(*f.cx, *ref_mem, 0, cont, 5);

  auto mem = f.memory(2);
  run(*f.cx, *mem, 0, prefix, 8);
  const Snapshot snap = mem->snapshot(0);
  EXPECT_EQ(snap.n_pos, 20);
  run(*f.cx, *mem, 0, detour, 4);  // move on with other tokens
  EXPECT_EQ(mem->seq_pos(0), 29);
  ASSERT_TRUE(mem->restore(0, snap).ok());
  EXPECT_EQ(mem->seq_pos(0), 20);
  EXPECT_EQ(max_diff(run(*f.cx, *mem, 0, cont, 5), ref), 0.f);
  // The same snapshot restored into another slot continues identically too.
  ASSERT_TRUE(mem->restore(1, snap).ok());
  EXPECT_EQ(max_diff(run(*f.cx, *mem, 1, cont, 3), ref), 0.f) ;
}

TEST_P(ModelMemory, SeqCopyContinuesLikeSource) {
  Fixture f(GetParam());
  const int64_t V = f.model->config().n_vocab;
  const auto prefix = random_tokens(17, V, 6), cont = random_tokens(6, V, 7);
  auto mem = f.memory(3);
  run(*f.cx, *mem, 1, prefix, 16);
  mem->seq_copy(1, 2);
  EXPECT_EQ(mem->seq_pos(2), 17);
  const Logits a = run(*f.cx, *mem, 1, cont, 1);
  const Logits b = run(*f.cx, *mem, 2, cont, 1);
  EXPECT_EQ(max_diff(a, b), 0.f);
}

TEST_P(ModelMemory, TwoSequencesBatchedEqualEachAlone) {
  Fixture f(GetParam());
  const int64_t V = f.model->config().n_vocab;
  const auto a_pre = random_tokens(15, V, 8), a_more = random_tokens(9, V, 9);
  const auto b_pre = random_tokens(4, V, 10), b_next = random_tokens(1, V, 11);
  // Alone.
  auto ma = f.memory(1), mb = f.memory(1);
  run(*f.cx, *ma, 0, a_pre, 64);
  const Logits a_ref = run(*f.cx, *ma, 0, a_more, 64);
  run(*f.cx, *mb, 0, b_pre, 64);
  const Logits b_ref = run(*f.cx, *mb, 0, b_next, 64);
  // Together: seq 1 decodes one token at position 4 while seq 0 prefills 9 tokens at 15..23.
  auto m = f.memory(2);
  run(*f.cx, *m, 0, a_pre, 64);
  run(*f.cx, *m, 1, b_pre, 64);
  Batch b;
  b.add_run(b_next, 4, 1, true);
  b.add_run(a_more, 15, 0, true);
  ASSERT_TRUE(f.cx->decode(b, *m).ok());
  ASSERT_EQ(f.cx->n_outputs(), 10);
  Logits got_b{{f.cx->logits(0), f.cx->logits(0) + V}}, got_a;
  for (int i = 1; i < 10; ++i) got_a.emplace_back(f.cx->logits(i), f.cx->logits(i) + V);
  EXPECT_LT(max_diff(got_a, a_ref), 2e-4);
  EXPECT_LT(max_diff(got_b, b_ref), 2e-4);
  EXPECT_EQ(m->seq_pos(0), 24);
  EXPECT_EQ(m->seq_pos(1), 5);
}

TEST_P(ModelMemory, BatchValidation) {
  Fixture f(GetParam());
  auto m = f.memory(2);
  Batch b;
  b.add(1, 0, 0, true);
  b.add(2, 2, 0, true);  // gap
  EXPECT_FALSE(f.cx->decode(b, *m).ok());
  b.clear();
  b.add(1, 3, 0, true);  // does not start at seq_pos 0
  EXPECT_FALSE(f.cx->decode(b, *m).ok());
  b.clear();
  b.add(int32_t(f.model->config().n_vocab), 0, 0, true);  // token out of range
  EXPECT_FALSE(f.cx->decode(b, *m).ok());
  b.clear();
  b.add(1, 0, 5, true);  // no such sequence
  EXPECT_FALSE(f.cx->decode(b, *m).ok());
  EXPECT_EQ(m->seq_pos(0), 0);
  b.clear();
  b.add(1, 0, 0, false);
  EXPECT_TRUE(f.cx->decode(b, *m).ok());
  EXPECT_EQ(f.cx->n_outputs(), 0);
  // Recurrent state cannot be rolled back; attention-only memory can.
  b.clear();
  b.add(2, 1, 0, true);
  ASSERT_TRUE(f.cx->decode(b, *m).ok());
  EXPECT_EQ(m->seq_keep(0, 1).ok(), !m->has_recurrent());
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelMemory, ::testing::Values("llama", "qwen3", "qwen35", "qwen35moe"));
INSTANTIATE_TEST_SUITE_P(Archs, HybridMemory, ::testing::Values("qwen35", "qwen35moe"));

TEST(ModelLoad, HybridAllocatesKvOnlyForAttentionLayers) {
  auto m = load_model(model_path("qwen35"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_attn_layers(), 1);  // full_attention_interval 4: layer 3 only
  EXPECT_FALSE(c.is_recurrent(3));
  EXPECT_TRUE(c.is_recurrent(0));
  MemoryOptions mo;
  mo.n_ctx = 100;
  mo.type_k = mo.type_v = GgmlType::F16;
  auto mem = Memory::create(c, mo);
  ASSERT_TRUE(mem.ok());
  const size_t kv = size_t(100) * 2 * size_t(c.n_head_kv * c.head_dim) * 2;  // K+V, F16, one layer
  const size_t rec = size_t(3) * size_t((c.ssm_d_conv - 1) * c.ssm_conv_dim() +
                                        c.ssm_d_state * c.ssm_d_state * c.ssm_dt_rank) * 4;
  EXPECT_EQ((*mem)->total_bytes(), kv + rec);
}

// -ngl without a usable CUDA device: the model loads on the CPU (one log line) and computes what a
// plain CPU load computes; the memory's layer states are host tensors of the documented shapes.
TEST(ModelLoad, GpuLayersWithoutCudaRunOnTheCpu) {
  if (backend::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is usable: the CPU fallback is not taken";
  LoadOptions lo;
  lo.n_gpu_layers = -1;
  auto m = load_model(model_path("qwen35"), lo);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ((*m)->info().n_gpu_layers, 0);
  EXPECT_FALSE((*m)->info().output_on_gpu);
  for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_EQ((*m)->layer_device(il).type(), backend::DeviceType::Cpu);
  EXPECT_EQ((*m)->output_device().type(), backend::DeviceType::Cpu);
  MemoryOptions mo;
  mo.n_ctx = 64;
  mo.n_seq = 2;
  mo.type_k = mo.type_v = GgmlType::F32;
  auto mem = Memory::create(**m, mo);
  ASSERT_TRUE(mem.ok());
  const std::array<int64_t, 4> kv = {c.head_dim, c.n_head_kv, 64, 2}, conv = {c.ssm_d_conv - 1, c.ssm_conv_dim(), 1, 2},
                               ssm = {c.ssm_d_state, c.ssm_d_state, c.ssm_dt_rank, 2};
  EXPECT_EQ((*mem)->k_cache(3).ne, kv);
  EXPECT_EQ((*mem)->v_cache(3).ne, kv);
  EXPECT_EQ((*mem)->conv_state(0).ne, conv);
  EXPECT_EQ((*mem)->ssm_state(0).ne, ssm);
  ContextOptions co;
  co.n_batch = 64;
  co.n_threads = 2;
  Context cx(**m, co);
  Fixture plain("qwen35");
  auto pm = plain.memory(1);
  const auto toks = random_tokens(12, c.n_vocab, 13);
  EXPECT_EQ(max_diff(run(cx, **mem, 1, toks, 5), run(*plain.cx, *pm, 0, toks, 5)), 0.f);
}

TEST(ModelLoad, MissingFileNamesThePath) {
  auto m = load_model("/nonexistent/model.gguf");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("/nonexistent/model.gguf"), std::string::npos);
}

// A minimal llama file: 1 layer, E=32, 2 heads; `bad` names one tensor to write with a wrong shape,
// `skip` one to leave out, `extra` adds an unused tensor.
std::string write_llama(const std::string& name, const std::string& bad, const std::string& skip, bool extra) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.embedding_length", 32);
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.feed_forward_length", 64);
  w.set_u32("llama.attention.head_count", 2);
  w.set_u32("llama.context_length", 128);
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"token_embd.weight", {32, 50}}, {"output_norm.weight", {32}},      {"blk.0.attn_norm.weight", {32}},
      {"blk.0.attn_q.weight", {32, 32}}, {"blk.0.attn_k.weight", {32, 32}}, {"blk.0.attn_v.weight", {32, 32}},
      {"blk.0.attn_output.weight", {32, 32}}, {"blk.0.ffn_norm.weight", {32}}, {"blk.0.ffn_gate.weight", {32, 64}},
      {"blk.0.ffn_up.weight", {32, 64}}, {"blk.0.ffn_down.weight", {64, 32}}};
  if (extra) t.push_back({"blk.0.something_new.weight", {32}});
  for (auto& [n, ne] : t) {
    if (n == skip) continue;
    if (n == bad) ne.back() += 1;
    const size_t row_bytes = size_t(ne[0]) * 4;
    auto st = w.add_tensor(n, GgmlType::F32, ne, [row_bytes](int64_t, int64_t rows, uint8_t* dst) {
      std::memset(dst, 0, size_t(rows) * row_bytes);
    });
    EXPECT_TRUE(st.ok());
  }
  const std::string path = (fs::temp_directory_path() / ("kiln_loader_" + name + ".gguf")).string();
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(ModelLoad, ErrorsNameFileAndTensor) {
  {
    auto m = load_model(write_llama("ok", "", "", true));
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_TRUE((*m)->config().tied_embeddings);
    ASSERT_EQ((*m)->info().unused.size(), 1u);  // reported, not fatal
    EXPECT_EQ((*m)->info().unused[0], "blk.0.something_new.weight");
  }
  {
    const std::string p = write_llama("shape", "blk.0.attn_k.weight", "", false);
    auto m = load_model(p);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("blk.0.attn_k.weight"), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find(p), std::string::npos) << m.error().message;
  }
  {
    auto m = load_model(write_llama("missing", "", "blk.0.ffn_up.weight", false));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("blk.0.ffn_up.weight"), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find("missing"), std::string::npos) << m.error().message;
  }
}

TEST(ModelLoad, MtpBlockIsLoadedNotRun) {
  const fs::path p = fs::temp_directory_path() / "kiln_test_model_memory" / "qwen35-mtp.gguf";
  fs::create_directories(p.parent_path());
  gen::GenOptions o;
  o.spec = gen::find_preset("tiny-qwen35")->spec;
  o.spec.n_mtp = 1;
  o.type = GgmlType::F32;
  o.seed = 7;  // same trunk weights as model_path("qwen35")
  o.n_threads = 2;
  ASSERT_TRUE(gen::generate(o, p.string()).ok());
  auto m = load_model(p.string());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->config().n_layer, 4);
  EXPECT_EQ((*m)->config().n_nextn, 1);
  ASSERT_EQ((*m)->mtp.size(), 1u);
  EXPECT_TRUE((*m)->mtp[0].nextn_eh_proj.present());
  EXPECT_TRUE((*m)->info().unused.empty());
  // The trunk computes the same logits as the file without the MTP block.
  Fixture plain("qwen35");
  ContextOptions co;
  co.n_batch = 64;
  co.n_threads = 2;
  Context cx(**m, co);
  MemoryOptions mo;
  mo.n_ctx = 64;
  mo.type_k = mo.type_v = GgmlType::F32;
  auto mem = Memory::create((*m)->config(), mo);
  ASSERT_TRUE(mem.ok());
  const auto toks = random_tokens(16, (*m)->config().n_vocab, 12);
  auto pm = plain.memory(1);
  EXPECT_EQ(max_diff(run(cx, **mem, 0, toks, 16), run(*plain.cx, *pm, 0, toks, 16)), 0.f);
}

}  // namespace
}  // namespace kiln::model
