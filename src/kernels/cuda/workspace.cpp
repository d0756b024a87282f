// kernels/cuda/workspace.cpp — the CUDA launchers' size arithmetic (see workspace.h) and the
//   workspace functions of cuda_ops.h. Plain C++: compiled in every build, so that a build without
//   CUDA can plan a GPU's memory with the numbers the GPU build uses.
// Must not: include CUDA headers. Threading: pure functions.
#include "kernels/cuda/workspace.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/invariant.h"

namespace kiln::cuda {

namespace {
std::atomic<bool> g_batch_invariant{false};
}  // namespace
void set_batch_invariant(bool on) { g_batch_invariant.store(on); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

namespace detail {
namespace {

int64_t chunk(size_t cap, int64_t k, int64_t total) {
  int64_t c = std::max<int64_t>(1, int64_t(cap / (2 * size_t(k))));
  if (c >= total) return total;
  return c >= 128 ? c / 128 * 128 : c;
}

}  // namespace

size_t block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: case GgmlType::IQ4_NL: return 18;
    case GgmlType::Q4_1: return 20;
    case GgmlType::Q5_0: return 22;
    case GgmlType::Q5_1: return 24;
    case GgmlType::Q8_0: return 34;
    case GgmlType::Q2_K: return 84;
    case GgmlType::Q3_K: return 110;
    case GgmlType::Q4_K: return 144;
    case GgmlType::Q5_K: return 176;
    case GgmlType::Q6_K: return 210;
    case GgmlType::IQ4_XS: return 136;
    default: return 0;
  }
}

GemmPlan gemm_plan(GgmlType wt, int64_t k, int64_t n, int64_t m) {
  GemmPlan p;
  p.w16 = wt != GgmlType::F32 && wt != GgmlType::F16;
  p.x16 = wt != GgmlType::F32;
  p.nc = p.w16 ? chunk(kW16Cap, k, n) : n;
  p.mc = p.x16 ? chunk(kX16Cap, k, m) : m;
  p.w16_bytes = p.w16 ? align256(2 * size_t(k) * size_t(p.nc)) : 0;
  p.bytes = p.w16_bytes + (p.x16 ? align256(2 * size_t(k) * size_t(p.mc)) : 0);
  return p;
}

bool matvec_q8_supported(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::IQ4_NL: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::IQ4_XS:
      return true;
    default: return false;
  }
}

size_t q8_x_meta_offset(int64_t k, int64_t ncols) { return align256(size_t(k) * size_t(ncols)); }
size_t q8_x_bytes(int64_t k, int64_t ncols) {
  return q8_x_meta_offset(k, ncols) + align256(size_t(k / 32) * size_t(ncols) * sizeof(Q8Meta));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An integer from the environment within [lo, hi], else def.
int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return def;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return *end == 0 && x >= lo && x <= hi ? int64_t(x) : def;
}

bool mmq_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::IQ4_NL: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

MmqPlan mmq_plan(GgmlType t, int64_t k, int64_t n, int64_t m) {
  MmqPlan p;
  if (!mmq_type(t) || k <= 0 || k % 256 != 0 || m < kMmqMinM || m > kMmqMaxM || n < 1) return p;
  p.ok = true;
  // From the shapes alone (the workspace and recorded graphs must not depend on the device): about
  // one wave of 2 CTAs per SM on a 132-SM GPU, each split keeping >= 4 steps. Measurement switches,
  // read once: KILN_CUDA_MMQ_CTAS (the grid the splits fill up to), KILN_CUDA_MMQ_MIN_STEPS.
  static const int64_t target = env_int("KILN_CUDA_MMQ_CTAS", 264, 32, 4096);
  static const int64_t min_steps = env_int("KILN_CUDA_MMQ_MIN_STEPS", 4, 1, 64);
  const int64_t tiles = ceil_div(n, kMmqRows), steps = k / 256;
  int64_t nks = 1;
  while (tiles * nks < target && steps >= 2 * min_steps * nks) nks *= 2;
  p.steps_per = ceil_div(steps, nks);
  p.nks = int(ceil_div(steps, p.steps_per));
  p.part_off = align256(size_t(m) * size_t(k) * 2);
  p.cnt_off = p.part_off + (p.nks > 1 ? align256(size_t(p.nks) * size_t(m) * size_t(n) * 4) : 0);
  p.bytes = p.cnt_off + (p.nks > 1 ? align256(size_t(tiles) * 4) : 0);
  return p;
}

int64_t mmq_id_max_tiles(int64_t n_slots, int64_t n_expert) {
  return ceil_div(n_slots, kMmqMaxM) + std::min(n_slots, n_expert);
}

MmqIdPlan mmq_id_plan(GgmlType t, int64_t k, int64_t n, int64_t n_slots) {
  MmqIdPlan p;
  if (!mmq_type(t) || k <= 0 || k % 256 != 0 || n < 1 || n_slots < kMmqIdMinSlots || n_slots > (int64_t(1) << 24))
    return p;
  p.ok = true;
  p.order_off = align256(size_t(n_slots) * size_t(k) * 2);
  p.tile_off = p.order_off + align256(size_t(n_slots) * 4);
  p.bytes = p.tile_off + align256(size_t(mmq_id_max_tiles(n_slots, n_slots)) * 8);
  return p;
}

void attn_set_splits(AttnPlan& pl, int64_t n_kv, int64_t ns) {
  ns = std::max<int64_t>(1, ns);
  pl.chunk = ceil_div(ceil_div(n_kv, ns), kAttnMinChunk) * kAttnMinChunk;
  pl.n_split = int(ceil_div(n_kv, pl.chunk));
}

AttnPlan attn_make_plan(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t T, int64_t n_kv) {
  AttnPlan pl;
  pl.dm = head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 512;
  const int rmax = pl.dm == 512 ? 8 : 16;
  const int64_t G = n_head / n_head_kv;
  for (int d = rmax; d >= 1; --d)
    if (G % d == 0) {
      pl.hg = d;
      break;
    }
  const bool inv = batch_invariant();  // one token per block, all its keys in that block (invariant.h)
  if (T <= kAttnDecodeTokens || inv) {
    pl.bq = 1;
    pl.rm = pl.hg <= 4 ? 4 : pl.hg <= 8 ? 8 : 16;
  } else {
    pl.rm = rmax;
    pl.bq = rmax / pl.hg;
  }
  pl.tiles = ceil_div(T, pl.bq);
  pl.groups = n_head / pl.hg;
  const int64_t base = pl.tiles * pl.groups;
  int64_t ns = 1;
  if (base < kAttnTargetBlocks && !inv) ns = std::min({ceil_div(kAttnTargetBlocks, base), n_kv / kAttnMinChunk, kAttnMaxSplit});
  attn_set_splits(pl, n_kv, ns);
  // The tensor-core kernel's grid (attention_mma.cu: 64 rows = 64 / hg tokens x hg heads per block).
  static const bool mma_split_off = [] {  // KILN_CUDA_ATTN_SPLIT=0: no key ranges (A/B timings); read once
    const char* env = std::getenv("KILN_CUDA_ATTN_SPLIT");
    return env != nullptr && std::strcmp(env, "0") == 0;
  }();
  if (T > kAttnDecodeTokens && !inv && !mma_split_off &&
      (head_dim == 64 || head_dim == 72 || head_dim == 128 || head_dim == 256) && n_kv >= 2 * kMmaSplitKeys) {
    const int64_t hm = std::min<int64_t>(G & -G, 64), mma_base = ceil_div(T, 64 / hm) * (n_head / hm);
    pl.mma_split = int(std::clamp<int64_t>(ceil_div(kMmaTargetBlocks, mma_base), 1,
                                           std::min<int64_t>(kMmaMaxSplit, n_kv / kMmaSplitKeys)));
  }
  return pl;
}

size_t attn_part_bytes(int64_t head_dim, int64_t n_head, int64_t T, int n_split) {
  const size_t o = (size_t(n_split) * size_t(T) * size_t(n_head) * size_t(head_dim) * 4 + 255) / 256 * 256;
  return o + size_t(n_split) * size_t(T) * size_t(n_head) * 8;
}

size_t cublas_workspace_bytes(int sm) { return sm >= 90 ? (size_t(32) << 20) : (size_t(4) << 20); }

GdnChunkLayout gdn_chunk_layout(int64_t Hv, int64_t n_tok) {
  GdnChunkLayout l;
  l.nr_max = n_tok / kGdnChunk;  // every chunked run has at least kGdnChunk tokens
  if (l.nr_max == 0 || Hv <= 0) return l;
  l.nc_max = ceil_div(n_tok, kGdnChunk) + l.nr_max;  // each run adds at most one partial chunk
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t o = off;
    off += align256(bytes);
    return o;
  };
  const size_t tok = size_t(n_tok) * sizeof(int32_t);
  l.skip = take(tok), l.rs = take(tok), l.rl = take(tok);
  l.chunks = take(size_t(l.nc_max) * 16), l.runs = take(size_t(l.nr_max) * 16), l.count = take(2 * sizeof(int32_t));
  l.mats = take(size_t(l.nc_max) * size_t(Hv) * size_t(kGdnMatFloats) * sizeof(float));
  l.bytes = off;
  return l;
}

}  // namespace detail

// ---- matmul_supported and the workspace functions of cuda_ops.h ----

bool matmul_supported(GgmlType wt) { return detail::block_bytes(wt) != 0; }

size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) {
  if (!matmul_supported(wt) || k <= 0 || n <= 0 || m <= 0) return 0;
  // int8 x: room for both x orders (matmul_n with an XProducer quantizes x once per order it needs).
  // Batch-invariant (invariant.h): the mat-vec path for every m.
  const size_t mmq = batch_invariant() ? 0 : detail::mmq_plan(wt, k, n, m).bytes;  // 0 where it does not apply
  if (m <= detail::kMvMaxM || (batch_invariant() && !detail::gemm_any_k(wt, k, m)))
    return std::max(mmq, detail::matvec_q8_supported(wt) ? 2 * detail::q8_x_bytes(k, m) : 0);
  return std::max(mmq, detail::gemm_plan(wt, k, n, m).bytes);
}

size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) {
  if (k <= 0 || n <= 0 || n_slots <= 0) return 0;
  const size_t grouped = batch_invariant() ? 0 : detail::mmq_id_plan(wt, k, n, n_slots).bytes;  // 0 where it does not apply
  // x columns quantized for the per-slot mat-vec: T (nx = 1) or K * T of them
  return std::max(grouped, detail::matvec_q8_supported(wt) ? detail::q8_x_bytes(k, n_slots) : 0);
}

size_t attention_workspace(const AttnArgs& a, int64_t n_tok) {
  if (n_tok <= 0 || a.n_head <= 0 || a.n_head_kv <= 0) return 0;
  // n_kv_max unknown (0): the most splits any cache length can get.
  const int64_t n_kv = a.n_kv_max > 0 ? a.n_kv_max : detail::kAttnMaxSplit * detail::kAttnMinChunk;
  const detail::AttnPlan pl = detail::attn_make_plan(a.head_dim, a.n_head, a.n_head_kv, n_tok, n_kv);
  return pl.part_splits() > 1 ? detail::attn_part_bytes(a.head_dim, a.n_head, n_tok, pl.part_splits()) : 0;
}

size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok) {
  if (chunk <= 0 || batch_invariant() || !detail::gdn_chunk_s(S)) return 0;
  return detail::gdn_chunk_layout(Hv, n_tok).bytes;
}

size_t top_logits_workspace(int64_t V, int64_t n, int k) {
  if (V <= 0 || n <= 0 || k <= 0) return 0;
  return size_t((V + kTopLogitsChunk - 1) / kTopLogitsChunk) * size_t(k) * size_t(n) * sizeof(uint64_t);
}

}  // namespace kiln::cuda
