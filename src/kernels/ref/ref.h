// kernels/ref/ref.h — scalar reference implementations of every op in kernels/ops.h.
// Owns: the oracle the dispatched kernels (kernels/cpu, later cuda) are tested against. Same
//   arguments and semantics as the kiln::kernels op of the same name (documented in ops.h),
//   minus the pool/workspace. Sums are accumulated in double; nothing here is fast.
// Must not: be called on hot paths; use SIMD, threads or workspaces.
// Threading: pure functions (outputs are the only state touched).
#pragma once
#include "kernels/ops.h"

namespace kiln::kernels::ref {

void matmul(const MatmulArgs& a);
void get_rows(GgmlType t, const void* table, size_t row_stride, int64_t n_rows, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride);
void rms_norm(CRows x, const float* w, Rows y, float eps);
void l2_norm(CRows x, Rows y, float eps);
void rope(Rows x, const int32_t* pos, const RopeParams& p);
void rope_multi(Rows x, const int32_t* pos, const RopeParams& p);
void softmax(Rows x, float scale);
void silu(const float* x, float* y, int64_t n);
void swiglu(const float* gate, const float* up, float* y, int64_t n);
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n);
void sigmoid(const float* x, float* y, int64_t n);
void softplus(const float* x, float* y, int64_t n);
void gelu(const float* x, float* y, int64_t n);
void gelu_erf(const float* x, float* y, int64_t n);
void add(const float* a, const float* b, float* y, int64_t n);
void mul(const float* a, const float* b, float* y, int64_t n);
void scale(const float* x, float s, float* y, int64_t n);
void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights);
void top_logits(const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals);
void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride);
void attention(CRows q, const int32_t* pos, const KvView& k, const KvView& v, const AttnParams& p, Rows out);
void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv);
void gated_delta_rule(const DeltaArgs& a);

}  // namespace kiln::kernels::ref
