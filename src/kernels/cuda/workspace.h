// kernels/cuda/workspace.h — the sizes the CUDA launchers plan with, as plain C++: the tensor-core
//   mat-mul's chunking (GemmPlan), the int8 x buffer of the mat-vec path, the attention work layout
//   (AttnPlan: split-KV) and the cuBLAS workspace a stream gives its handle.
// Owns: the one definition of those sizes. The launchers (matmul.cu, attention.cu, matvec_q8_x.cu)
//   and the workspace functions of cuda_ops.h use these, and the memory planner (model/fit.h, through
//   backend::workspace_sizes) reads the same numbers in builds without CUDA and without a GPU.
// Must not: include CUDA headers or launch anything (this file is compiled in every build).
// Threading: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/types.h"

namespace kiln::cuda::detail {

using gguf::GgmlType;

inline constexpr int64_t kMvMaxM = 16;                    // columns up to which the mat-vec kernel is used
inline constexpr size_t kW16Cap = size_t(64) << 20;       // bytes of one dequantized F16 W chunk
inline constexpr size_t kX16Cap = size_t(32) << 20;       // bytes of one F16 X chunk
inline constexpr int64_t kAttnDecodeTokens = 64;          // attention: batches up to this many tokens: one token per block
inline constexpr int64_t kAttnTargetBlocks = 256;         // split the key range until about this many blocks
inline constexpr int64_t kAttnMinChunk = 64;              // keys per split at least (a multiple of every BK)
inline constexpr int64_t kAttnMaxSplit = 256;
// The tensor-core prefill kernel (attention_mma.cu) splits a tile's keys when its grid is small: up to
// kMmaMaxSplit ranges until about kMmaTargetBlocks blocks, each of at least kMmaSplitKeys keys (a tile
// with fewer keys than two such ranges is not split; decided on the device from its last position).
inline constexpr int64_t kMmaTargetBlocks = 512;
inline constexpr int kMmaMaxSplit = 8;
inline constexpr int kMmaSplitKeys = 1024;

inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
// Bytes of one block of a type the mat-mul launchers take (0: not supported; matmul_supported).
size_t block_bytes(GgmlType t);

// The row / column chunking of the tensor-core path (matmul_workspace and matmul agree through it).
struct GemmPlan {
  bool w16 = false, x16 = false;  // W dequantized to F16 / X rounded to F16 in the workspace
  int64_t nc = 0, mc = 0;         // rows of W / columns of X per chunk
  size_t w16_bytes = 0, bytes = 0;
};
GemmPlan gemm_plan(GgmlType wt, int64_t k, int64_t n, int64_t m);

// Per 32 x values: the F32 scale d (bits) and the int sums of the int8 values at positions 0..15
// (low 16 bits, signed) and 16..31 (high 16 bits).
struct Q8Meta {
  uint32_t d_bits, sums;
};
bool matvec_q8_supported(GgmlType t);  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL Q4_K Q5_K Q6_K IQ4_XS
// Workspace bytes of ncols quantized x columns of k values (k a multiple of 32): xq at ws, xs at
// ws + q8_x_meta_offset.
size_t q8_x_meta_offset(int64_t k, int64_t ncols);
size_t q8_x_bytes(int64_t k, int64_t ncols);

// Dense weights (F32 / F16 / BF16) whose k is a multiple of 8 but not of 32 (a vision tower's 4304-wide
// FFN): only the cuBLAS path takes them, for more than kMvMaxM columns — also with --batch-invariant
// (an image is encoded alone, its columns never share a launch with another request's).
inline bool gemm_any_k(GgmlType t, int64_t k, int64_t m) {
  return (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) && k % 32 != 0 && k % 8 == 0 &&
         m > kMvMaxM;
}

// The small-batch quantized mat-mul (mmq.cu): kMmqMinM..kMmqMaxM columns, the block types of
// mmq_type, k a multiple of 256. Row tiles of kMmqRows; the k range cut into nks splits of steps_per steps
// of 256 (more splits while the grid is under ~264 CTAs, each split keeping >= 4 steps). Workspace:
// x as F16 [m][k] at 0, the splits' partial sums F32 [nks][m][n] at part_off and one counter per
// row tile at cnt_off (nks > 1), bytes in all.
inline constexpr int64_t kMmqMinM = 9, kMmqMaxM = 32, kMmqRows = 128;
struct MmqPlan {
  bool ok = false;
  int nks = 1;
  int64_t steps_per = 0;
  size_t part_off = 0, cnt_off = 0, bytes = 0;
};
bool mmq_type(GgmlType t);  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL Q4_K Q5_K Q6_K IQ4_XS
MmqPlan mmq_plan(GgmlType t, int64_t k, int64_t n, int64_t m);

// The grouped expert mat-mul (mmq.cu, matmul_id with at least kMmqIdMinSlots slots): the slots sorted
// by expert, each expert's columns in tiles of up to kMmqMaxM through the small-batch mat-mul, so a
// prefill reads each expert matrix once per tile instead of once per slot. Workspace: x as F16
// [n_slots][k] at 0, the sorted slots [n_slots] int32 at order_off, the tile table (int2 per tile, at
// most mmq_id_max_tiles) at tile_off; bytes in all (sized without n_expert: tiles <= n_slots / 32 + n_slots).
inline constexpr int64_t kMmqIdMinSlots = 128, kMmqIdMaxExperts = 1024;
struct MmqIdPlan {
  bool ok = false;
  size_t order_off = 0, tile_off = 0, bytes = 0;
};
MmqIdPlan mmq_id_plan(GgmlType t, int64_t k, int64_t n, int64_t n_slots);
int64_t mmq_id_max_tiles(int64_t n_slots, int64_t n_expert);

// The attention work layout, a function of (head_dim, n_head, n_head_kv, n_tok, n_kv) only, so that
// attention_workspace and the launcher agree.
struct AttnPlan {
  int dm = 0, rm = 0, hg = 1, bq = 1, n_split = 1;
  int64_t tiles = 0, groups = 0, chunk = 0;
  int mma_split = 1;  // key ranges per tensor-core tile at most (where that kernel runs)
  int part_splits() const { return n_split > mma_split ? n_split : mma_split; }  // the partials' layout
};
int64_t ceil_div(int64_t a, int64_t b);
void attn_set_splits(AttnPlan& pl, int64_t n_kv, int64_t ns);
AttnPlan attn_make_plan(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t T, int64_t n_kv);
// Bytes of the split-KV partial results (outputs, then max / sum pairs).
size_t attn_part_bytes(int64_t head_dim, int64_t n_head, int64_t T, int n_split);

// The chunked gated delta rule (deltanet_chunked.cuh): runs of at least max(chunk, kGdnChunk) tokens,
// cut into chunks of kGdnChunk tokens from the run's start, for state sizes S of gdn_chunk_s. The
// plan is found on the device; its layout is sized for the worst case of n_tok tokens: per token
// the chunked flag (skip, int32) and two scan scratch arrays (rs, rl); at most nc_max chunk entries
// (int4 {t0, n}) and nr_max run entries (int4 {first chunk, chunks, slot}); the two counts; per
// (chunk, value head) kGdnMatFloats floats: the chunk's (I + A)^-1 and output matrix [C][C] and its
// cumulative log-decays [C].
inline constexpr int64_t kGdnChunk = 64;
inline constexpr int64_t kGdnMatFloats = 2 * kGdnChunk * kGdnChunk + kGdnChunk;
inline bool gdn_chunk_s(int64_t S) { return S == 32 || S == 64 || S == 128; }
struct GdnChunkLayout {
  int64_t nc_max = 0, nr_max = 0;
  size_t skip = 0, rs = 0, rl = 0, chunks = 0, runs = 0, count = 0, mats = 0, bytes = 0;
};
GdnChunkLayout gdn_chunk_layout(int64_t Hv, int64_t n_tok);

// The cuBLAS workspace each CUDA stream allocates for its handle (so that cuBLAS never allocates
// while a graph is captured; NVIDIA's advice: 32 MiB on Hopper and later, 4 MiB before). sm =
// compute capability * 10 + minor.
size_t cublas_workspace_bytes(int sm);

}  // namespace kiln::cuda::detail
