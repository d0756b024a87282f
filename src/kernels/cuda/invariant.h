// kernels/cuda/invariant.h — the batch-invariant switch of the CUDA launchers (`--batch-invariant`).
// Owns: one process-wide flag. On, every launcher picks its kernel and its work split from the shapes
//   of one token's work alone, never from how many tokens or sequences share the launch, so a
//   token's outputs are the same bits whether it is decoded alone, batched with other slots, or
//   prefilled in any chunk (prefix-cache hits included):
//   - matmul / matmul_n / matmul_id: the mat-vec kernels for every column count (8 columns a pass,
//     k-split from (k, n) only; no small-batch tensor-core mat-mul, no cuBLAS, no segmented launch);
//   - attention: one block per (token, q-head group) over all of its keys (no split-KV, no tensor-core
//     prefill tiles);
//   - delta net: the unfused ops and the token recurrence (no chunked form).
//   Off (the default): the fastest kernel per launch, whose rounding can change with the batch.
// Must not: change anything while a graph is being captured (graphs bake the kernels chosen).
// Threading: set once before the first launch (a Context does it when it is created); read anywhere.
#pragma once

namespace kiln::cuda {

void set_batch_invariant(bool on);
bool batch_invariant();

}  // namespace kiln::cuda
