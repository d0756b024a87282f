// The MTP drafter on CUDA (model/mtp.cpp through backend::Stream: the catch-up inside the recorded
// step graphs, the drafts op by op) against the CPU, on tiny generated qwen35 / qwen35moe models with
// an MTP block (F32 weights), skipped with the reason where no GPU is usable:
//  - every layer, the output and the MTP block on the GPU (LoadOptions::mtp): a prompt in two chunks
//    (one step of more than 64 tokens, one graph-sized), three draft steps: the drafts equal the CPU's,
//    the last step's logits within 2e-3 of the row's max |logit|;
//  - then a verify run [t, d0, d1, d2] with seq_accept of 1 token and a second draft: the same bounds
//    (the hidden state kept in a keep slot on the device);
//  - -ngl n_layer (the layers and the MTP block on the GPU, the output and its head matrix on the
//    host) and -ngl n_layer - 1 (the first layer on the host too): the same;
//  - two rows drafting 3 and 2 positions, ids only (all on the GPU: one recorded graph with a host
//    node gathering the embeddings), twice (capture, then replay): the CPU's drafts;
//  - the same two rows with a draft vocabulary of half the ids (ContextOptions::mtp_draft_vocab), on
//    the recorded graph and op by op: the CPU's drafts;
//  - deferred catch-up (Batch::mtp_defer in recorded steps, then Context::mtp_flush): the CPU's drafts.
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

struct MtpRun {
  std::unique_ptr<Model> m;
  std::unique_ptr<Context> cx;
  std::unique_ptr<Memory> mem;
  MtpRun(const std::string& path, int ngl, int64_t draft_vocab = 0) {
    LoadOptions lo;
    lo.n_gpu_layers = ngl;
    lo.mtp = true;
    auto mm = load_model(path, lo);
    EXPECT_TRUE(mm.ok()) << mm.error().message;
    m = std::move(*mm);
    ContextOptions co;
    co.n_batch = 128;
    co.n_threads = 2;
    co.mtp = true;
    co.mtp_draft_vocab = draft_vocab;
    cx = std::make_unique<Context>(*m, co);
    MemoryOptions mo;
    mo.n_ctx = 256;
    mo.n_seq = 2;
    mo.n_spec = 3;
    mo.mtp = true;
    auto mm2 = Memory::create(*m, mo);
    EXPECT_TRUE(mm2.ok()) << mm2.error().message;
    mem = std::move(*mm2);
  }
  void decode(const Batch& b) {
    Status s = cx->decode(b, *mem);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  }
  std::pair<std::vector<int32_t>, Row> draft(int seq, int32_t tok, int n) {
    std::vector<Context::MtpRow> rows{{seq, tok, n}};
    std::vector<std::vector<int32_t>> out;
    Status s = cx->mtp_draft(rows, 0.f, *mem, out, /*keep_logits=*/true);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    if (!s.ok() || cx->n_outputs() != 1) return {};
    return {out[0], Row(cx->logits(0), cx->logits(0) + m->config().n_vocab)};
  }
  // Two rows of different lengths, ids only (on one GPU: the recorded-graph path).
  std::vector<std::vector<int32_t>> draft2() {
    std::vector<Context::MtpRow> rows{{0, 30, 3}, {1, 7, 2}};
    std::vector<std::vector<int32_t>> out;
    Status s = cx->mtp_draft(rows, 0.f, *mem, out);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return out;
  }
};

// The steps both devices run: a 70-token chunk, a 10-token chunk, drafts; a verify run, accept 1, drafts.
std::vector<std::pair<std::vector<int32_t>, Row>> script(MtpRun& r, const std::vector<int32_t>& p) {
  std::vector<std::pair<std::vector<int32_t>, Row>> out;
  Batch b;
  b.add_run(std::span<const int32_t>(p).subspan(0, 70), 0, 0, false);
  r.decode(b);
  b.clear();
  b.add_run(std::span<const int32_t>(p).subspan(70, 10), 70, 0, false);
  r.decode(b);
  out.push_back(r.draft(0, 9, 3));
  b.clear();
  const int32_t run[] = {9, 21, 22, 23};
  for (int i = 0; i < 4; ++i) b.add(run[i], 80 + i, 0, true, i < 3);
  r.decode(b);
  EXPECT_TRUE(r.mem->seq_accept(0, 82, 1).ok());
  out.push_back(r.draft(0, 30, 3));
  return out;
}

void compare(const std::pair<std::vector<int32_t>, Row>& cpu, const std::pair<std::vector<int32_t>, Row>& gpu,
             const std::string& what) {
  ASSERT_EQ(cpu.second.size(), gpu.second.size()) << what;
  float mx = 0, diff = 0;
  for (size_t i = 0; i < cpu.second.size(); ++i) {
    mx = std::max(mx, std::fabs(cpu.second[i]));
    diff = std::max(diff, std::fabs(cpu.second[i] - gpu.second[i]));
  }
  EXPECT_LE(diff, 2e-3f * std::max(1.f, mx)) << what;
  // Greedy drafts of random models have clear margins (a near tie would show as a logits difference too).
  EXPECT_EQ(cpu.first, gpu.first) << what;
}

class CudaMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaMtp, DraftsEqualCpu) {
  if (backend::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << backend::cuda_unavailable_reason();
  const std::string path = test::generated_model("kiln_test_cuda_mtp", GetParam(), gguf::GgmlType::F32, 5);
  MtpRun cpu(path, 0);
  const auto p = test::random_tokens(80, cpu.m->config().n_vocab, 8);
  const auto ref = script(cpu, p);
  cpu.decode([&] {
    Batch b;
    b.add_run(std::span<const int32_t>(p).subspan(0, 20), 0, 1, false);
    return b;
  }());
  const auto ref2 = cpu.draft2();
  ASSERT_EQ(ref2.size(), 2u);
  EXPECT_EQ(ref2[0].size(), 3u);
  EXPECT_EQ(ref2[1].size(), 2u);
  const int L = int(cpu.m->config().n_layer);
  for (int ngl : {kGpuLayersAll, L, L - 1}) {
    MtpRun gpu(path, ngl);
    const auto got = script(gpu, p);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) compare(ref[i], got[i], GetParam() + " ngl " + std::to_string(ngl) + " draft " + std::to_string(i));
    Batch b;
    b.add_run(std::span<const int32_t>(p).subspan(0, 20), 0, 1, false);
    gpu.decode(b);
    EXPECT_EQ(gpu.draft2(), ref2) << GetParam() << " ngl " << ngl << ": two rows, ids only";
    EXPECT_EQ(gpu.draft2(), ref2) << GetParam() << " ngl " << ngl << ": the same again (a replay)";
  }
  // A draft vocabulary of half the ids (--spec-draft-vocab): the recorded graph (-ngl all) and the
  // op-by-op drafts with the head on the host (-ngl n_layer) draft the CPU's ids, all below it.
  const int64_t vd = cpu.m->config().n_vocab / 2;
  auto two_rows = [&](int ngl) {
    MtpRun r(path, ngl, vd);
    script(r, p);
    Batch b;
    b.add_run(std::span<const int32_t>(p).subspan(0, 20), 0, 1, false);
    r.decode(b);
    return r.draft2();
  };
  const auto ref_v = two_rows(0);
  ASSERT_EQ(ref_v.size(), 2u);
  for (const auto& ids : ref_v)
    for (int32_t t : ids) EXPECT_LT(t, vd);
  for (int ngl : {kGpuLayersAll, L})
    EXPECT_EQ(two_rows(ngl), ref_v) << GetParam() << " ngl " << ngl << ": draft vocabulary " << vd;
}

// Deferred catch-up on the device (Batch::mtp_defer in the recorded decode steps, then one batched
// Context::mtp_flush): a prompt, four decode steps with the catch-up, eight deferred, the flush and
// a draft give the CPU's drafts (which equal the per-step catch-up's: test_model_mtp) and logits.
TEST_P(CudaMtp, DeferredCatchUpEqualsCpu) {
  if (backend::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << backend::cuda_unavailable_reason();
  const std::string path = test::generated_model("kiln_test_cuda_mtp", GetParam(), gguf::GgmlType::F32, 5);
  auto run = [&](int ngl) {
    MtpRun r(path, ngl);
    const auto t = test::random_tokens(42, r.m->config().n_vocab, 11);
    Batch b;
    b.add_run(std::span<const int32_t>(t).subspan(0, 30), 0, 0, false);
    r.decode(b);
    for (int p = 30; p < 42; ++p) {
      b.clear();
      b.add(t[size_t(p)], p, 0, true);
      b.mtp_defer = p >= 34;
      r.decode(b);
    }
    EXPECT_EQ(r.mem->mtp_done(0), 34) << "ngl " << ngl;
    const int32_t seqs[] = {0};
    const std::span<const int32_t> toks[] = {std::span<const int32_t>(t)};
    const Status s = r.cx->mtp_flush(seqs, toks, *r.mem);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return r.draft(0, 9, 3);
  };
  const auto ref = run(0);
  ASSERT_EQ(ref.first.size(), 3u);
  const int L = int(MtpRun(path, 0).m->config().n_layer);  // -ngl L: the flush on the GPU, the head on the host
  for (int ngl : {kGpuLayersAll, L}) compare(ref, run(ngl), GetParam() + " deferred, ngl " + std::to_string(ngl));
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaMtp, ::testing::Values("tiny-qwen35-mtp", "tiny-qwen35moe-mtp"));

}  // namespace
}  // namespace kiln::model
