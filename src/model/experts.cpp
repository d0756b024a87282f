// model/experts.cpp — the routed experts of a MoE block, on the device that holds their weights
// (see routed_experts in blocks.h). A GPU block whose expert tensors stay in host memory (--cpu-moe,
// --n-cpu-moe, -ot: model/placement.h) sends its normed FFN input [E, T] and the router's ids [K, T]
// to the host, the host stream runs the three matmul_id over the mapped weights, and the expert
// outputs [E, K, T] go back; the router, top-k, the weighted sum and the shared expert stay on the
// block's device (qwen35moe.cpp). Such a step is not recorded as one graph (Context::Impl::graph_step).
#include "core/check.h"
#include "model/blocks.h"

namespace kiln::model {
namespace {

using backend::Binary;
using backend::DeviceType;

// gate/up read token t's column for every slot (nx = 1); down reads its slot's hidden column.
void run_experts(const Step& s, const LayerWeights& L) {
  const int64_t T = s.T, E = s.c.n_embd, K = s.c.n_expert_used, F = s.c.n_ff_exp;
  const Tensor cur = dense_view(s.a.cur, E, 1, T);
  const Tensor fa = dense_view(s.a.fa, F, K, T), fb = dense_view(s.a.fb, F, K, T), ye = dense_view(s.a.ye, E, K, T);
  s.st.matmul_id(L.ffn_gate_exps.t, cur, s.a.ids, fa);
  s.st.matmul_id(L.ffn_up_exps.t, cur, s.a.ids, fb);
  s.st.binary(Binary::SwiGlu, fa, fb, fa);  // per slot column of F
  s.st.matmul_id(L.ffn_down_exps.t, fa, s.a.ids, ye);
}

bool on_host(const Step& s) { return s.st.device().type() == DeviceType::Cpu; }

// `bytes` of src (on from's device) into dst (on to's): one of the two is the host, whose memory
// the other side reads or writes directly (as Context::Impl::move_x).
void hop(const Step& from, const Tensor& src, const Step& to, const Tensor& dst, size_t bytes) {
  if (on_host(from)) to.st.upload(dst, src.host(), bytes);
  else from.st.download(dst.host(), src, bytes);
}

}  // namespace

void routed_experts(const Step& s, const LayerWeights& L) {
  if (!s.experts) return run_experts(s, L);
  const Step& e = *s.experts;
  KILN_CHECK(on_host(s) != on_host(e), "routed_experts: moving activations between two GPUs is not supported");
  KILN_CHECK(e.T == s.T, "routed_experts: the expert device's views are for {} tokens, the block's for {}", e.T, s.T);
  const int64_t T = s.T, E = s.c.n_embd, K = s.c.n_expert_used;
  hop(s, s.a.cur, e, e.a.cur, size_t(E * T) * sizeof(float));
  hop(s, s.a.ids, e, e.a.ids, size_t(K * T) * sizeof(int32_t));
  if (!on_host(s)) s.st.synchronize();  // the host reads what the GPU wrote
  run_experts(e, L);
  hop(e, e.a.ye, s, s.a.ye, size_t(E * K * T) * sizeof(float));
  if (!on_host(e)) e.st.synchronize();  // the host block reads the outputs next
}

}  // namespace kiln::model
