// backend/cuda_sizes.h — CudaSizes: the workspace sizes of a CUDA stream (backend::WorkspaceSizes
//   over the launchers' size functions of kernels/cuda/cuda_ops.h, which are plain C++ compiled in
//   every build). CudaStream answers its workspace questions through one; workspace_sizes(Cuda)
//   hands one out for planning without a GPU.
// Must not: include CUDA headers (builds without CUDA include this). Internal to backend/.
// Threading: stateless.
#pragma once
#include "backend/backend.h"
#include "kernels/cuda/cuda_ops.h"

namespace kiln::backend {

class CudaSizes final : public WorkspaceSizes {
 public:
  static cuda::AttnArgs attn_args(const AttnSpec& p, int64_t n_kv_max) {
    cuda::AttnArgs a;
    a.head_dim = p.head_dim;
    a.n_head = p.n_head;
    a.n_head_kv = p.n_head_kv;
    a.scale = p.scale;
    a.n_kv_max = n_kv_max;
    a.causal = p.causal;
    return a;
  }
  size_t matmul_workspace(GgmlType wt, int64_t k, int64_t n, int64_t m) const override {
    return cuda::matmul_workspace(wt, k, n, m);
  }
  size_t gated_delta_workspace(int64_t S, int64_t Hv, int chunk, int64_t n_tok) const override {
    return cuda::gated_delta_workspace(S, Hv, chunk, n_tok);
  }
  size_t attention_workspace(const AttnSpec& p, int64_t n_tok, int64_t n_kv_max) const override {
    return cuda::attention_workspace(attn_args(p, n_kv_max), n_tok);
  }
  size_t matmul_id_workspace(GgmlType wt, int64_t k, int64_t n, int64_t n_slots) const override {
    return cuda::matmul_id_workspace(wt, k, n, n_slots);
  }
  size_t top_logits_workspace(int64_t n_vocab, int64_t n_rows, int k) const override {
    return cuda::top_logits_workspace(n_vocab, n_rows, k);
  }
};

}  // namespace kiln::backend
