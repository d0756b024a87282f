// Speculative rollback in model::Memory / Context (MemoryOptions::n_spec, Batch::keep, seq_accept):
// a verify run of k+1 tokens with the per-token recurrent states kept, then "accept n" (a switch of
// state slots, attention truncated), then the next token — bit-identical logits to plain decoding of
// the accepted prefix, on tiny generated models (qwen35 hybrid, qwen35moe, llama attention-only), F32
// weights, on the CPU. Also: two sequences verifying in one batch next to a third's prefill, keep
// slots reused over many rounds, prefix-cache style read_rec/write_rec through the slot map, and the
// errors (keep beyond n_spec, accept outside the run).
#include <gtest/gtest.h>

#include <cstring>

#include "model/context.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"

namespace kiln::model {
namespace {

using Row = std::vector<float>;

struct Env {
  std::unique_ptr<Model> m;
  std::unique_ptr<Context> cx;
  explicit Env(const std::string& arch) {
    auto mm = load_model(test::generated_model("kiln_test_model_spec", "tiny-" + arch, gguf::GgmlType::F32, 11));
    EXPECT_TRUE(mm.ok()) << mm.error().message;
    m = std::move(*mm);
    ContextOptions co;
    co.n_batch = 64;
    co.n_threads = 2;
    cx = std::make_unique<Context>(*m, co);
  }
  std::unique_ptr<Memory> memory(int n_seq, int n_spec) {
    MemoryOptions mo;
    mo.n_ctx = 128;
    mo.n_seq = n_seq;
    mo.n_spec = n_spec;
    auto mem = Memory::create(*m, mo);
    EXPECT_TRUE(mem.ok()) << mem.error().message;
    return std::move(*mem);
  }
  int64_t V() const { return m->config().n_vocab; }
  // Decodes b; returns every output row.
  std::vector<Row> decode(const Batch& b, Memory& mem) {
    auto st = cx->decode(b, mem);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    std::vector<Row> out;
    if (st.ok())
      for (int64_t r = 0; r < cx->n_outputs(); ++r) out.emplace_back(cx->logits(r), cx->logits(r) + V());
    return out;
  }
  // Plain decoding: toks one at a time on seq; the logits of each.
  std::vector<Row> plain(Memory& mem, int seq, const std::vector<int32_t>& toks) {
    std::vector<Row> out;
    for (int32_t t : toks) {
      Batch b;
      b.add(t, int32_t(mem.seq_pos(seq)), seq, true);
      auto r = decode(b, mem);
      if (r.empty()) break;
      out.push_back(r[0]);
    }
    return out;
  }
};

// A verify run [toks...] on seq with the states after every token but the last kept.
Batch verify_batch(const std::vector<int32_t>& toks, int32_t pos0, int seq) {
  Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], pos0 + int32_t(i), seq, true, i + 1 < toks.size());
  return b;
}

bool same(const Row& a, const Row& b) { return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0; }

class SpecRollback : public ::testing::TestWithParam<std::string> {};

// For every n in 0..k: prompt, verify [t0, d0..d(k-1)], accept n drafts, then two more tokens; the
// verify rows 0..n and the two continuation rows equal plain decoding of prompt, t0, d0..d(n-1), x, y.
TEST_P(SpecRollback, AcceptNEqualsPlainDecoding) {
  Env e(GetParam());
  const int k = 3;
  const auto prompt = test::random_tokens(9, e.V(), 1);
  const auto win = test::random_tokens(k + 1, e.V(), 2);  // t0, d0, d1, d2
  const auto cont = test::random_tokens(2, e.V(), 3);     // x, y
  for (int n = 0; n <= k; ++n) {
    SCOPED_TRACE("accepted " + std::to_string(n));
    auto ms = e.memory(1, k);
    Batch pb;
    pb.add_run(prompt, 0, 0, false);
    e.decode(pb, *ms);
    const auto vr = e.decode(verify_batch(win, int32_t(prompt.size()), 0), *ms);
    ASSERT_EQ(vr.size(), size_t(k + 1));
    ASSERT_TRUE(ms->seq_accept(0, int64_t(prompt.size()) + 1 + n, n == k ? -1 : n).ok());
    const auto cr = e.plain(*ms, 0, cont);

    auto mp = e.memory(1, 0);
    Batch qb;
    qb.add_run(prompt, 0, 0, false);
    e.decode(qb, *mp);
    std::vector<int32_t> seq(win.begin(), win.begin() + n + 1);
    seq.insert(seq.end(), cont.begin(), cont.end());
    const auto pr = e.plain(*mp, 0, seq);
    ASSERT_EQ(pr.size(), size_t(n + 3));
    for (int i = 0; i <= n; ++i) EXPECT_TRUE(same(vr[size_t(i)], pr[size_t(i)])) << "verify row " << i;
    EXPECT_TRUE(same(cr[0], pr[size_t(n + 1)])) << "first token after the rollback";
    EXPECT_TRUE(same(cr[1], pr[size_t(n + 2)])) << "second token after the rollback";
  }
}

// Many rounds on two sequences verifying in the same batch as a third sequence's prefill chunk;
// accept counts cycle, so keep slots are swapped in and out repeatedly. Every emitted row equals
// the plain decoding of what was accepted.
TEST_P(SpecRollback, BatchedRoundsEqualPlainDecoding) {
  Env e(GetParam());
  const int k = 3;
  auto ms = e.memory(3, k);
  auto mp = e.memory(3, 0);
  std::vector<std::vector<int32_t>> accepted(2);
  std::vector<std::vector<Row>> rows(2);
  for (int s = 0; s < 2; ++s) {
    const auto p = test::random_tokens(5 + s, e.V(), 10 + uint32_t(s));
    Batch b;
    b.add_run(p, 0, s, false);
    e.decode(b, *ms);
    e.decode(b, *mp);
  }
  const auto long_prompt = test::random_tokens(40, e.V(), 20);
  int64_t lp = 0;
  for (int round = 0; round < 8; ++round) {
    Batch b;
    std::vector<std::vector<int32_t>> win(2);
    for (int s = 0; s < 2; ++s) {
      win[size_t(s)] = test::random_tokens(k + 1, e.V(), 100 + uint32_t(round * 2 + s));
      const Batch vb = verify_batch(win[size_t(s)], int32_t(ms->seq_pos(s)), s);
      for (int64_t i = 0; i < vb.size(); ++i) b.add(vb.token[size_t(i)], vb.pos[size_t(i)], s, true, vb.keep[size_t(i)]);
    }
    const int64_t n = std::min<int64_t>(5, int64_t(long_prompt.size()) - lp);
    if (n > 0) b.add_run(std::span(long_prompt).subspan(size_t(lp), size_t(n)), int32_t(lp), 2, false, false);
    lp += n;
    const auto out = e.decode(b, *ms);
    ASSERT_EQ(out.size(), size_t(2 * (k + 1)));
    for (int s = 0; s < 2; ++s) {
      const int acc = (round + s) % (k + 1);
      const int64_t base = ms->seq_pos(s) - (k + 1);
      ASSERT_TRUE(ms->seq_accept(s, base + 1 + acc, acc == k ? -1 : acc).ok());
      for (int i = 0; i <= acc; ++i) {
        accepted[size_t(s)].push_back(win[size_t(s)][size_t(i)]);
        rows[size_t(s)].push_back(out[size_t(s * (k + 1) + i)]);
      }
    }
  }
  for (int s = 0; s < 2; ++s) {
    const auto pr = e.plain(*mp, s, accepted[size_t(s)]);
    ASSERT_EQ(pr.size(), rows[size_t(s)].size());
    for (size_t i = 0; i < pr.size(); ++i) EXPECT_TRUE(same(pr[i], rows[size_t(s)][i])) << "seq " << s << " row " << i;
  }
  // The state moved between slots survives a read_rec / write_rec round trip (the prefix cache's path).
  if (ms->has_recurrent()) {
    std::vector<float> a(ms->rec_floats()), b(mp->rec_floats());
    ms->read_rec(0, a.data());
    mp->read_rec(0, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  }
}

TEST_P(SpecRollback, Errors) {
  Env e(GetParam());
  auto ms = e.memory(1, 2);
  const auto toks = test::random_tokens(4, e.V(), 5);
  auto st = e.cx->decode(verify_batch(toks, 0, 0), *ms);  // keeps 3 states, the memory has 2 keep slots
  if (ms->has_recurrent()) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("n_spec"), std::string::npos) << st.error().message;
  }
  ms->seq_clear(0);
  ASSERT_TRUE(e.cx->decode(verify_batch({toks[0], toks[1], toks[2]}, 0, 0), *ms).ok());
  EXPECT_FALSE(ms->seq_accept(0, 4, 0).ok());   // beyond the run
  EXPECT_FALSE(ms->seq_accept(0, 0, 0).ok());   // nothing kept
  if (ms->has_recurrent()) {
    EXPECT_FALSE(ms->seq_accept(0, 2, 2).ok());  // keep slot 2 of 2
  }
  EXPECT_TRUE(ms->seq_accept(0, 2, 1).ok());
  EXPECT_EQ(ms->seq_pos(0), 2);
}

INSTANTIATE_TEST_SUITE_P(Arch, SpecRollback, ::testing::Values("qwen35", "qwen35moe", "llama"));

}  // namespace
}  // namespace kiln::model
