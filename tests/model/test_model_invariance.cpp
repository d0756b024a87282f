// Batch invariance of the forward pass (issue 6: parallel streams at temperature 0 = each alone;
// prefix cache on = off), on tiny generated models (tiny-llama, tiny-qwen35, tiny-qwen35moe) with
// F16 and quantized weights (Q4_1, Q4_K, IQ4_XS) and F16 / Q8_0 KV caches. Everything is compared
// bit for bit (memcmp), never within a tolerance:
//  - a sequence decoded alone = the same sequence in a batch with other sequences' prefill chunks
//    and decode tokens, at a different batch position;
//  - a prompt prefilled in one chunk = chunks of 7 = token by token: final logits and the whole
//    sequence state (KV rows and recurrent states, via Memory::snapshot) are identical;
//  - cold prefill = prefill of all but the last token, snapshot, restore into another slot, last
//    token alone (what the engine's prefix cache does);
//  - 1 thread = 2 threads.
// The oracle is the model itself run alone, one sequence, whole prompt in one call, one thread.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/context.h"
#include "model/gen/gen.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"

namespace kiln::model {
namespace {

using gguf::GgmlType;

std::string model_path(const std::string& preset, GgmlType t) {
  return test::generated_model("kiln_test_model_invariance", preset, t, 11);
}
using test::random_tokens;

using Row = std::vector<float>;

bool same_bits(const Row& a, const Row& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_state(const Snapshot& a, const Snapshot& b) {
  return a.n_pos == b.n_pos && a.kv == b.kv && a.rec.size() == b.rec.size() &&
         std::memcmp(a.rec.data(), b.rec.data(), a.rec.size() * sizeof(float)) == 0;
}

struct Param {
  std::string preset;
  GgmlType wt;
};

class ModelInvariance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto m = load_model(model_path(GetParam().preset, GetParam().wt));
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    V_ = model_->config().n_vocab;
  }
  std::unique_ptr<Context> context(int threads) {
    ContextOptions co;
    co.n_batch = 64;
    co.n_threads = threads;
    return std::make_unique<Context>(*model_, co);
  }
  std::unique_ptr<Memory> memory(int n_seq, GgmlType kv) {
    MemoryOptions mo;
    mo.n_ctx = 320;  // > 256: attention crosses a fixed key chunk
    mo.n_seq = n_seq;
    mo.type_k = mo.type_v = kv;
    auto m = Memory::create(model_->config(), mo);
    KILN_CHECK(m.ok(), "memory");
    return std::move(*m);
  }
  // Feeds toks to seq in chunks; returns the logits of the last token.
  Row prefill(Context& cx, Memory& mem, int seq, const std::vector<int32_t>& toks, size_t chunk) {
    Row last;
    for (size_t i = 0; i < toks.size(); i += chunk) {
      const size_t n = std::min(chunk, toks.size() - i);
      Batch b;
      b.add_run(std::span(toks.data() + i, n), int32_t(mem.seq_pos(seq)), seq, false);
      auto st = cx.decode(b, mem);
      EXPECT_TRUE(st.ok()) << st.error().message;
      if (!st.ok() || cx.n_outputs() != 1) return {};
      last.assign(cx.logits(0), cx.logits(0) + V_);
    }
    return last;
  }
  std::unique_ptr<Model> model_;
  int64_t V_ = 0;
};

TEST_P(ModelInvariance, PrefillChunkingAndThreadsDoNotChangeBits) {
  auto cx1 = context(1), cx2 = context(2);
  const auto toks = random_tokens(290, V_, 1);
  for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0}) {
    auto ref_mem = memory(1, kv);
    const Row ref = prefill(*cx1, *ref_mem, 0, std::vector<int32_t>(toks.begin(), toks.begin() + 50), 64);
    ASSERT_EQ(ref.size(), size_t(V_));
    const Snapshot ref_state = ref_mem->snapshot(0);
    const std::vector<int32_t> p50(toks.begin(), toks.begin() + 50);
    for (Context* cx : {cx1.get(), cx2.get()})
      for (size_t chunk : {size_t(1), size_t(7), size_t(50)}) {
        if (cx == cx1.get() && chunk == 50) continue;  // that is the reference
        auto mem = memory(1, kv);
        const Row got = prefill(*cx, *mem, 0, p50, chunk);
        EXPECT_TRUE(same_bits(got, ref)) << "chunk " << chunk << " threads " << cx->pool().size() << " kv "
                                         << gguf::type_name(kv);
        EXPECT_TRUE(same_state(mem->snapshot(0), ref_state))
            << "state, chunk " << chunk << " threads " << cx->pool().size() << " kv " << gguf::type_name(kv);
      }
    // Past the first 256-key attention chunk: 290 tokens in chunks of 64 vs 29.
    if (kv != GgmlType::F16) continue;
    auto ma = memory(1, kv), mb = memory(1, kv);
    const Row a = prefill(*cx2, *ma, 0, toks, 64), b = prefill(*cx1, *mb, 0, toks, 29);
    EXPECT_TRUE(same_bits(a, b)) << "290 tokens, kv " << gguf::type_name(kv);
    EXPECT_TRUE(same_state(ma->snapshot(0), mb->snapshot(0))) << "290 tokens, kv " << gguf::type_name(kv);
  }
}

TEST_P(ModelInvariance, CachedPrefixEqualsCold) {
  // The engine's prefix cache: restore the state of all but the last prompt token, recompute the
  // last token alone; it must equal the cold prefill of the whole prompt.
  auto cx = context(2);
  const auto prompt = random_tokens(37, V_, 2);
  auto cold_mem = memory(1, GgmlType::F16);
  const Row cold = prefill(*cx, *cold_mem, 0, prompt, 64);
  auto mem = memory(2, GgmlType::F16);
  prefill(*cx, *mem, 0, std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 64);
  ASSERT_TRUE(mem->restore(1, mem->snapshot(0)).ok());
  const Row warm = prefill(*cx, *mem, 1, {prompt.back()}, 64);
  EXPECT_TRUE(same_bits(warm, cold));
  EXPECT_TRUE(same_state(mem->snapshot(1), cold_mem->snapshot(0)));
}

TEST_P(ModelInvariance, BatchedSequencesEqualEachAlone) {
  auto cx = context(2);
  const GgmlType kv = GgmlType::F16;
  const auto a_prompt = random_tokens(21, V_, 3), a_gen = random_tokens(6, V_, 4);
  const auto b_prompt = random_tokens(30, V_, 5), c_prompt = random_tokens(9, V_, 6), c_gen = random_tokens(7, V_, 7);
  // Alone: A's prompt in one chunk, then its tokens one by one.
  std::vector<Row> a_ref;
  {
    auto m = memory(1, kv);
    a_ref.push_back(prefill(*cx, *m, 0, a_prompt, 64));
    for (int32_t t : a_gen) a_ref.push_back(prefill(*cx, *m, 0, {t}, 1));
  }
  // Batched, 3 slots: C is decoding, B prefills in chunks, A prefills then decodes; A sits at a
  // different batch position in every step.
  auto m = memory(3, kv);
  prefill(*cx, *m, 2, c_prompt, 64);
  std::vector<Row> a_got;
  size_t b_done = 0;
  for (size_t step = 0; step <= a_gen.size(); ++step) {
    Batch b;
    int a_row = -1, rows = 0;
    if (step % 2 == 1) { b.add(c_gen[step], int32_t(m->seq_pos(2)), 2, true); ++rows; }
    if (b_done < b_prompt.size()) {
      const size_t n = std::min<size_t>(11, b_prompt.size() - b_done);
      b.add_run(std::span(b_prompt.data() + b_done, n), int32_t(m->seq_pos(1)), 1, step % 3 == 0);
      rows += step % 3 == 0 ? int(n) : 1;
      b_done += n;
    }
    if (step == 0) b.add_run(a_prompt, 0, 0, false);
    else b.add(a_gen[step - 1], int32_t(m->seq_pos(0)), 0, true);
    a_row = rows;
    if (step % 2 == 0) b.add(c_gen[step], int32_t(m->seq_pos(2)), 2, true);
    auto st = cx->decode(b, *m);
    ASSERT_TRUE(st.ok()) << st.error().message;
    a_got.emplace_back(cx->logits(a_row), cx->logits(a_row) + V_);
  }
  ASSERT_EQ(a_got.size(), a_ref.size());
  for (size_t i = 0; i < a_ref.size(); ++i) EXPECT_TRUE(same_bits(a_got[i], a_ref[i])) << "step " << i;
}

std::vector<Param> params() {
  std::vector<Param> v;
  for (const char* p : {"tiny-llama", "tiny-qwen35"})
    for (GgmlType t : {GgmlType::F16, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::IQ4_XS}) v.push_back({p, t});
  v.push_back({"tiny-qwen35moe", GgmlType::Q4_K});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelInvariance, ::testing::ValuesIn(params()), [](const auto& info) {
  std::string n = info.param.preset + "_" + std::string(gguf::type_name(info.param.wt));
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

}  // namespace
}  // namespace kiln::model
