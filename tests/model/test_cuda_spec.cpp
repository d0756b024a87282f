// Speculative rollback on CUDA (the `keep` tensor of the recurrent ops, Memory::seq_accept on device
// state) against the CPU path, on tiny generated qwen35 / qwen35moe models (F32 weights), every layer
// and the output on the GPU (skipped with the reason where no GPU is usable):
//  - a verify run of k + 1 tokens with the states kept, accept n (0..k), two more tokens: the GPU's
//    logits equal its own plain decoding of the accepted prefix (same device; bound 2e-3 of the row's
//    max |logit|: a 4-token step and 1-token steps take different mat-mul paths) and the CPU's rows
//    (same bound);
//  - the same with the verify run inside a batch of more than 64 tokens (a 70-token prefill chunk of
//    another sequence next to it), which takes the unfused conv1d_silu / gated_delta kernels instead
//    of the fused ones (deltanet_fused.cu covers batches up to 64 tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "model/context.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"

namespace kiln::model {
namespace {

using Row = std::vector<float>;

struct Dev {
  std::unique_ptr<Model> m;
  std::unique_ptr<Context> cx;
  Dev(const std::string& path, bool gpu) {
    LoadOptions lo;
    lo.n_gpu_layers = gpu ? kGpuLayersAll : 0;
    auto mm = load_model(path, lo);
    EXPECT_TRUE(mm.ok()) << mm.error().message;
    m = std::move(*mm);
    ContextOptions co;
    co.n_batch = 128;
    co.n_threads = 2;
    cx = std::make_unique<Context>(*m, co);
  }
  std::unique_ptr<Memory> memory(int n_spec) {
    MemoryOptions mo;
    mo.n_ctx = 256;
    mo.n_seq = 2;
    mo.n_spec = n_spec;
    auto mem = Memory::create(*m, mo);
    EXPECT_TRUE(mem.ok()) << mem.error().message;
    return std::move(*mem);
  }
  std::vector<Row> decode(const Batch& b, Memory& mem) {
    auto st = cx->decode(b, mem);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    std::vector<Row> out;
    const int64_t V = m->config().n_vocab;
    if (st.ok())
      for (int64_t r = 0; r < cx->n_outputs(); ++r) out.emplace_back(cx->logits(r), cx->logits(r) + V);
    return out;
  }
  std::vector<Row> plain(Memory& mem, const std::vector<int32_t>& toks) {
    std::vector<Row> out;
    for (int32_t t : toks) {
      Batch b;
      b.add(t, int32_t(mem.seq_pos(0)), 0, true);
      auto r = decode(b, mem);
      if (!r.empty()) out.push_back(r[0]);
    }
    return out;
  }
  // prompt, then the verify run [win] (next to a `side`-token prefill of sequence 1 when side > 0),
  // accept n, then cont token by token: the verify rows 0..n and the continuation rows.
  std::vector<Row> spec(const std::vector<int32_t>& prompt, const std::vector<int32_t>& win, int n,
                        const std::vector<int32_t>& cont, const std::vector<int32_t>& side) {
    const int k = int(win.size()) - 1;
    auto mem = memory(k);
    Batch pb;
    pb.add_run(prompt, 0, 0, false);
    decode(pb, *mem);
    Batch vb;
    for (size_t i = 0; i < win.size(); ++i)
      vb.add(win[i], int32_t(prompt.size() + i), 0, true, i + 1 < win.size());
    if (!side.empty()) vb.add_run(side, 0, 1, false, false);
    auto rows = decode(vb, *mem);
    rows.resize(size_t(n + 1));
    EXPECT_TRUE(mem->seq_accept(0, int64_t(prompt.size()) + 1 + n, n == k ? -1 : n).ok());
    for (auto& r : plain(*mem, cont)) rows.push_back(std::move(r));
    return rows;
  }
};

float rel_diff(const Row& a, const Row& b) {
  float m = 1e-6f, d = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i])), d = std::max(d, std::fabs(a[i] - b[i]));
  return d / m;
}

class CudaSpec : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpec, RollbackMatchesPlainAndCpu) {
  if (backend::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << backend::cuda_unavailable_reason();
  const std::string path = test::generated_model("kiln_test_cuda_spec", "tiny-" + GetParam(), gguf::GgmlType::F32, 13);
  Dev cpu(path, false), gpu(path, true);
  const int64_t V = cpu.m->config().n_vocab;
  const auto prompt = test::random_tokens(11, V, 1), win = test::random_tokens(4, V, 2), cont = test::random_tokens(2, V, 3);
  for (const bool big : {false, true}) {
    const auto side = big ? test::random_tokens(70, V, 4) : std::vector<int32_t>{};
    for (int n = 0; n <= 3; ++n) {
      SCOPED_TRACE("accepted " + std::to_string(n) + ", batch " + std::to_string(4 + side.size()) + " tokens");
      const auto g = gpu.spec(prompt, win, n, cont, side);
      const auto c = cpu.spec(prompt, win, n, cont, side);
      auto mp = gpu.memory(0);
      Batch pb;
      pb.add_run(prompt, 0, 0, false);
      gpu.decode(pb, *mp);
      std::vector<int32_t> seq(win.begin(), win.begin() + n + 1);
      seq.insert(seq.end(), cont.begin(), cont.end());
      const auto p = gpu.plain(*mp, seq);
      ASSERT_EQ(g.size(), p.size());
      ASSERT_EQ(c.size(), p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_LT(rel_diff(g[i], p[i]), 2e-3f) << "GPU row " << i << " vs the GPU's plain decoding";
        EXPECT_LT(rel_diff(g[i], c[i]), 2e-3f) << "GPU row " << i << " vs the CPU";
      }
    }
  }
}

// The same batch shapes without speculation (no keep slots, no keep tensor): a 4-token run of a
// sequence with history next to a 70-token prefill of another, GPU rows vs the CPU's. Separates the
// batch-shape path (more than 64 tokens, two runs) from the keep machinery above.
TEST_P(CudaSpec, MixedBatchOverHistoryMatchesCpu) {
  if (backend::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << backend::cuda_unavailable_reason();
  const std::string path = test::generated_model("kiln_test_cuda_spec", "tiny-" + GetParam(), gguf::GgmlType::F32, 13);
  Dev cpu(path, false), gpu(path, true);
  const int64_t V = cpu.m->config().n_vocab;
  const auto prompt = test::random_tokens(11, V, 1), win = test::random_tokens(4, V, 2);
  for (const int n_side : {0, 40, 70}) {
    for (const int n_spec : {0, 3}) {
      SCOPED_TRACE("side run " + std::to_string(n_side) + " tokens, n_spec " + std::to_string(n_spec));
      const auto side = test::random_tokens(n_side, V, 4);
      std::vector<Row> rows[2];
      for (int d = 0; d < 2; ++d) {
        Dev& dv = d == 0 ? cpu : gpu;
        auto mem = dv.memory(n_spec);
        Batch pb;
        pb.add_run(prompt, 0, 0, false);
        dv.decode(pb, *mem);
        Batch vb;
        vb.add_run(win, int32_t(prompt.size()), 0, true);
        if (!side.empty()) vb.add_run(side, 0, 1, false, true);
        rows[d] = dv.decode(vb, *mem);
      }
      ASSERT_EQ(rows[0].size(), rows[1].size());
      for (size_t i = 0; i < rows[0].size(); ++i) EXPECT_LT(rel_diff(rows[1][i], rows[0][i]), 2e-3f) << "row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, CudaSpec, ::testing::Values("qwen35", "qwen35moe"));

}  // namespace
}  // namespace kiln::model
