// model/vision_encode.cpp — VisionEncoder: one image through the qwen3vl_merger graph (vision.h)
// with backend::Stream ops on the projector's device. The host builds the patch matrix (merge
// order), the resized position table and the RoPE positions; everything else is enqueued. The
// blocks' full attention is one non-causal run (AttnSpec::causal = false) over the image's keys,
// kept F32 on the CPU (the HF oracle's 1e-3) and F16 on a GPU (its tensor-core attention path, as
// llama.cpp's flash attention in its encoder).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/blocks.h"
#include "model/vision.h"

namespace kiln::model {

using backend::Binary;
using backend::Tensor;
using backend::Unary;

struct VisionEncoder::Impl {
  const VisionModel& m;
  const VisionConfig& c;
  std::unique_ptr<backend::Device> cpu;  // the CPU device on the caller's pool (CPU projector)
  backend::Device* dev = nullptr;
  std::unique_ptr<backend::Stream> st;
  backend::Arena A;
  int64_t planned = 0;  // patches the Arena holds
  VisionArena o{};
  GgmlType kv_type = GgmlType::F32;  // the attention's K/V rows: F32 on the CPU, F16 on a GPU

  Impl(const VisionModel& model, ThreadPool& pool) : m(model), c(model.config()) {
    if (m.device().type() == backend::DeviceType::Cpu) {
      cpu = backend::make_cpu_device(pool);
      dev = cpu.get();
    } else {
      dev = &m.device();
    }
    st = dev->create_stream();
    if (dev->type() != backend::DeviceType::Cpu) kv_type = GgmlType::F16;  // as scratch_bytes plans it
  }

  static backend::AttnSpec attn_spec(const VisionDims& d) {
    backend::AttnSpec a;
    a.head_dim = d.n_embd / d.n_head;
    a.n_head = a.n_head_kv = d.n_head;
    a.scale = 1.0f / std::sqrt(float(a.head_dim));
    a.flash = true;
    a.causal = false;  // every patch sees every patch of its image
    return a;
  }

  // The stream's workspace for N patches; without a model (the planner), F16 matrices.
  static size_t workspace(const backend::WorkspaceSizes& ws, const VisionModel* m, const VisionDims& d, int64_t N) {
    const backend::AttnSpec a = attn_spec(d);
    const int64_t E = d.n_embd, M = N / 4, C = std::min(N, kVisionChunk);
    auto t = [&](const Weight* w, GgmlType dflt) { return w ? w->type : dflt; };
    const VisionLayer* L = m ? &m->layers[0] : nullptr;
    size_t s = 64;
    s = std::max(s, ws.matmul_workspace(GgmlType::F32, d.patch_len(), E, N));
    s = std::max(s, ws.matmul_workspace(GgmlType::F32, E, 1, N));
    s = std::max(s, ws.matmul_workspace(GgmlType::F32, 4 * E, 1, M));
    // Every block's weights share a type in the files llama.cpp writes; take the first block's.
    s = std::max(s, ws.matmul_workspace(t(L ? &L->qkv_w : nullptr, GgmlType::F16), E, 3 * E, C));
    s = std::max(s, ws.matmul_workspace(t(L ? &L->o_w : nullptr, GgmlType::F16), E, E, N));
    s = std::max(s, ws.matmul_workspace(t(L ? &L->up_w : nullptr, GgmlType::F16), E, d.n_ff, C));
    s = std::max(s, ws.matmul_workspace(t(L ? &L->down_w : nullptr, GgmlType::F16), d.n_ff, E, C));
    s = std::max(s, ws.matmul_workspace(t(m ? &m->mm0_w : nullptr, GgmlType::F16), 4 * E, d.n_mff, M));
    s = std::max(s, ws.matmul_workspace(t(m ? &m->mm2_w : nullptr, GgmlType::F16), d.n_mff, d.n_out_total, M));
    s = std::max(s, ws.attention_workspace(a, N, N));
    return s;
  }

  void grow(int64_t N) {
    if (N <= planned) return;
    vision_arena(c.dims(), N, kv_type, A, o);
    A.allocate(*dev);
    size_t ws = workspace(*st, &m, c.dims(), N);
    const int64_t C = std::min(N, kVisionChunk), M = N / 4;  // columns: a chunk, all patches, merged tokens
    for (const VisionLayer& L : m.layers)
      for (auto [w, cols] : {std::pair{&L.qkv_w, C}, {&L.o_w, N}, {&L.up_w, C}, {&L.down_w, C}, {&L.ds_fc1_w, M}, {&L.ds_fc2_w, M}})
        if (w->present()) ws = std::max(ws, st->matmul_workspace(w->type, w->ne[0], w->ne[1], cols));
    st->reserve_workspace(ws);
    planned = N;
  }

  Tensor t(size_t off, GgmlType type, std::array<int64_t, 4> ne) const { return A.tensor(off, type, ne); }

  // LayerNorm over rows [n, T] of x into y: the mean by mat-mul with a 1/n vector, its subtraction,
  // RMSNorm of the centred rows (= LayerNorm) times w, plus b.
  void layer_norm(const Tensor& x, const Weight& w, const Weight& b, const Weight& inv, const Tensor& y, int64_t T) {
    const Tensor mean = t(o.mean, GgmlType::F32, {1, T, 1, 1});
    st->matmul(inv.t, x, mean);
    st->scale(mean, -1.0f, mean);
    st->binary(Binary::Add, x, mean, y);
    st->rms_norm(y, &w.t, y, c.eps);
    st->binary(Binary::Add, y, b.t, y);
  }

  // y = W x + b (y [W rows, T], strided columns allowed).
  void linear(const Weight& w, const Weight& b, const Tensor& x, const Tensor& y) {
    st->matmul(w.t, x, y);
    st->binary(Binary::Add, y, b.t, y);
  }

  Result<ImageEmbedding> encode(const float* chw, int w, int h) {
    const int64_t P = c.patch, E = c.n_embd, D = c.head_dim(), H = c.n_head, unit = P * c.merge;
    if (w <= 0 || h <= 0 || w % unit != 0 || h % unit != 0)
      return err("image of {}x{} pixels: sides must be positive multiples of {}", w, h, unit);
    const int64_t gw = w / P, gh = h / P, N = gw * gh, M = N / 4, no = c.n_out_total(), CH = kVisionChunk;
    grow(N);
    // Host inputs: patches and positions in 2x2 merge order (merged row, merged column, dy, dx). The
    // RoPE positions chunk by chunk (kVisionChunk patches: stream s of patch t0 + i at 4 t0 + s n + i).
    std::vector<float> X(size_t(3 * P * P * N));
    std::vector<int32_t> vpos(size_t(4 * N)), seq(size_t(N), 0), kpos(size_t(N), 0);
    std::vector<float> pe(size_t(E * N));
    const int64_t n = c.n_pos_side;
    int64_t k = 0;
    for (int64_t y = 0; y < gh; y += 2)
      for (int64_t x = 0; x < gw; x += 2)
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx, ++k) {
            const int64_t py = y + dy, px = x + dx;
            float* col = &X[size_t(k * 3 * P * P)];
            for (int64_t ch = 0; ch < 3; ++ch)
              for (int64_t ky = 0; ky < P; ++ky)
                std::memcpy(col + (ch * P + ky) * P, chw + (ch * h + py * P + ky) * w + px * P, size_t(P) * 4);
            const int64_t t0 = k / CH * CH, cn = std::min(CH, N - t0);
            int32_t* vp = &vpos[size_t(4 * t0 + (k - t0))];
            vp[0] = int32_t(py), vp[cn] = int32_t(px), vp[2 * cn] = int32_t(py), vp[3 * cn] = int32_t(px);
            kpos[size_t(k)] = int32_t(k);
            // The learned position table bilinearly resized to gh x gw (align corners), as HF's
            // fast_pos_embed_interpolate and ggml_interpolate(BILINEAR | ALIGN_CORNERS).
            const float fy = gh > 1 ? float(py) * float(n - 1) / float(gh - 1) : 0.f;
            const float fx = gw > 1 ? float(px) * float(n - 1) / float(gw - 1) : 0.f;
            const int64_t y0 = int64_t(fy), x0 = int64_t(fx);
            const int64_t y1 = std::min(y0 + 1, n - 1), x1 = std::min(x0 + 1, n - 1);
            const float ay = fy - float(y0), ax = fx - float(x0);
            const float w00 = (1 - ay) * (1 - ax), w01 = (1 - ay) * ax, w10 = ay * (1 - ax), w11 = ay * ax;
            const float* t00 = &m.pos_embd[size_t((y0 * n + x0) * E)];
            const float* t01 = &m.pos_embd[size_t((y0 * n + x1) * E)];
            const float* t10 = &m.pos_embd[size_t((y1 * n + x0) * E)];
            const float* t11 = &m.pos_embd[size_t((y1 * n + x1) * E)];
            float* dst = &pe[size_t(k * E)];
            for (int64_t e = 0; e < E; ++e) dst[e] = w00 * t00[e] + w01 * t01[e] + w10 * t10[e] + w11 * t11[e];
          }
    // The arena (vision_arena): h the residual stream; cur the normed rows (first the patch matrix),
    // then the attention output; qr the roped queries (first the position table), then the
    // projections' outputs and the DeepStack norm; qkv / ff one chunk's q|k|v and FFN rows.
    const Tensor th = t(o.h, GgmlType::F32, {E, N, 1, 1}), cur = t(o.cur, GgmlType::F32, {E, N, 1, 1});
    const Tensor qr = t(o.q, GgmlType::F32, {E, N, 1, 1});
    const Tensor tX = t(o.cur, GgmlType::F32, {3 * P * P, N, 1, 1}), tpe = qr;
    const Tensor kc = t(o.kc, kv_type, {D, H, N, 1}), vc = t(o.vc, kv_type, {D, H, N, 1});  // N keys: the run's
    const Tensor tvpos = t(o.vpos, GgmlType::I32, {4 * N, 1, 1, 1}), tseq = t(o.seq, GgmlType::I32, {N, 1, 1, 1});
    const Tensor tkpos = t(o.kpos, GgmlType::I32, {N, 1, 1, 1});
    const Tensor out = t(o.out, GgmlType::F32, {no, M, 1, 1}), cur4 = t(o.q, GgmlType::F32, {4 * E, M, 1, 1});
    st->upload(tX, X.data(), X.size() * 4);
    st->upload(tpe, pe.data(), pe.size() * 4);
    st->upload(tvpos, vpos.data(), vpos.size() * 4);
    st->upload(tseq, seq.data(), seq.size() * 4);
    st->upload(tkpos, kpos.data(), kpos.size() * 4);
    auto i32_at = [&](size_t off, int64_t i0, int64_t cnt) { return t(off + size_t(i0) * 4, GgmlType::I32, {cnt, 1, 1, 1}); };

    linear(m.patch_w, m.patch_b, tX, th);
    st->binary(Binary::Add, th, tpe, th);
    kernels::RopeParams rp;
    rp.n_rot = int(D);
    rp.neox = true;
    rp.freq_base = 10000.f;
    rp.multi = kernels::RopeParams::Multi::Vision;
    for (int& s : rp.sections) s = int(D / 4);
    const backend::AttnSpec spec = attn_spec(c.dims());
    size_t i_ds = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const VisionLayer& L = m.layers[size_t(il)];
      layer_norm(th, L.ln1_w, L.ln1_b, m.inv_n, cur, N);
      // q|k|v a chunk at a time: roped; the keys and values into the F16 / F32 cache rows t0.., the
      // queries into qr.
      for (int64_t t0 = 0; t0 < N; t0 += CH) {
        const int64_t cn = std::min(CH, N - t0);
        const Tensor qkv = t(o.qkv, GgmlType::F32, {3 * E, cn, 1, 1});
        linear(L.qkv_w, L.qkv_b, rows_view(cur, E, cn, 1, E, E * cn, E * t0), qkv);
        const Tensor q = rows_view(qkv, D, H, cn, D, 3 * E), kk = rows_view(qkv, D, H, cn, D, 3 * E, E),
                     v = rows_view(qkv, D, H, cn, D, 3 * E, 2 * E);
        const Tensor vp = i32_at(o.vpos, 4 * t0, 4 * cn), sq = i32_at(o.seq, t0, cn), kp = i32_at(o.kpos, t0, cn);
        st->rope_multi(q, vp, rp);
        st->rope_multi(kk, vp, rp);
        st->kv_store(kk, sq, kp, kc);
        st->kv_store(v, sq, kp, vc);
        st->copy(rows_view(qr, D, H, cn, D, E, E * t0), q);
      }
      // Full attention: the N patches' keys at rows 0..N-1 of one slot, one non-causal run.
      st->attention(dense_view(qr, D, H, N), tseq, tkpos, kc, vc, spec, dense_view(cur, D, H, N));
      st->matmul(L.o_w.t, cur, qr);
      st->binary(Binary::Add, qr, L.o_b.t, qr);
      st->binary(Binary::Add, th, qr, th);
      layer_norm(th, L.ln2_w, L.ln2_b, m.inv_n, cur, N);
      for (int64_t t0 = 0; t0 < N; t0 += CH) {  // the MLP a chunk at a time, into qr
        const int64_t cn = std::min(CH, N - t0);
        const Tensor ff = t(o.ff, GgmlType::F32, {c.n_ff, cn, 1, 1});
        linear(L.up_w, L.up_b, rows_view(cur, E, cn, 1, E, E * cn, E * t0), ff);
        st->unary(Unary::Gelu, ff, ff);
        linear(L.down_w, L.down_b, ff, rows_view(qr, E, cn, 1, E, E * cn, E * t0));
      }
      st->binary(Binary::Add, th, qr, th);
      if (L.ds_fc1_w.present()) {
        // DeepStack: 4 merged patches' states, their own norm and MLP, into output slice 1 + i_ds.
        ++i_ds;
        const Tensor h4 = th.reshape({4 * E, M, 1, 1});
        layer_norm(h4, L.ds_norm_w, L.ds_norm_b, m.inv_n4, cur4, M);
        const Tensor mf = t(o.mff, GgmlType::F32, {L.ds_fc1_w.ne[1], M, 1, 1});
        linear(L.ds_fc1_w, L.ds_fc1_b, cur4, mf);
        st->unary(Unary::GeluErf, mf, mf);
        linear(L.ds_fc2_w, L.ds_fc2_b, mf, rows_view(out, c.n_out, M, 1, no, no * M, int64_t(i_ds) * c.n_out));
      }
    }
    layer_norm(th, m.post_ln_w, m.post_ln_b, m.inv_n, cur, N);
    const Tensor mf = t(o.mff, GgmlType::F32, {c.n_merger_ff, M, 1, 1});
    linear(m.mm0_w, m.mm0_b, cur.reshape({4 * E, M, 1, 1}), mf);
    st->unary(Unary::GeluErf, mf, mf);
    linear(m.mm2_w, m.mm2_b, mf, rows_view(out, c.n_out, M, 1, no, no * M));
    ImageEmbedding r;
    r.nx = int(gw / 2);
    r.ny = int(gh / 2);
    r.data.resize(size_t(no * M));
    st->download(r.data.data(), out, r.data.size() * 4);
    st->synchronize();
    return r;
  }
};

VisionEncoder::VisionEncoder(const VisionModel& m, ThreadPool& pool) : impl_(std::make_unique<Impl>(m, pool)) {}
VisionEncoder::~VisionEncoder() = default;

Result<ImageEmbedding> VisionEncoder::encode(const float* chw, int w, int h) { return impl_->encode(chw, w, h); }

// The encoder's scratch for n patches (model/vision.h): buffers sized max over the uses that share them.
size_t vision_arena(const VisionDims& d, int64_t N, GgmlType kv, backend::Arena& A, VisionArena& o) {
  const int64_t E = d.n_embd, M = N / 4, C = std::min(N, kVisionChunk), D = d.n_embd / d.n_head;
  A.reset();
  o.h = A.reserve_tensor(GgmlType::F32, {E, N, 1, 1});
  o.cur = A.reserve_tensor(GgmlType::F32, {std::max(E, d.patch_len()), N, 1, 1});  // also the patch matrix
  o.q = A.reserve_tensor(GgmlType::F32, {E, N, 1, 1});                              // also pe, cur4 [4E, M]
  o.kc = A.reserve_tensor(kv, {D, d.n_head, N, 1});
  o.vc = A.reserve_tensor(kv, {D, d.n_head, N, 1});
  o.qkv = A.reserve_tensor(GgmlType::F32, {3 * E, C, 1, 1});
  o.ff = A.reserve_tensor(GgmlType::F32, {d.n_ff, C, 1, 1});
  o.mean = A.reserve_tensor(GgmlType::F32, {1, N, 1, 1});
  o.vpos = A.reserve_tensor(GgmlType::I32, {4 * N, 1, 1, 1});
  o.seq = A.reserve_tensor(GgmlType::I32, {N, 1, 1, 1});
  o.kpos = A.reserve_tensor(GgmlType::I32, {N, 1, 1, 1});
  o.mff = A.reserve_tensor(GgmlType::F32, {d.n_mff, M, 1, 1});
  o.out = A.reserve_tensor(GgmlType::F32, {d.n_out_total, M, 1, 1});
  return A.planned();
}

uint64_t VisionEncoder::scratch_bytes(const VisionDims& d, int64_t n_patches, backend::DeviceType type) {
  backend::Arena A;
  VisionArena o{};
  const bool cpu = type == backend::DeviceType::Cpu;
  const size_t arena = vision_arena(d, n_patches, cpu ? GgmlType::F32 : GgmlType::F16, A, o);
  return arena + Impl::workspace(*backend::workspace_sizes(type), nullptr, d, n_patches);
}

VisionDims VisionConfig::dims() const {
  VisionDims d;
  d.n_embd = n_embd, d.n_ff = n_ff, d.n_head = n_head, d.patch = patch, d.n_mff = std::max(n_merger_ff, n_ds_ff),
  d.n_out_total = n_out_total();
  return d;
}

}  // namespace kiln::model
