// model/context.cpp — Context: devices and streams, scratch planning (one Arena per device), batch
// validation, and the step shared by every architecture: embeddings (host), the layers on their
// devices, the output rows; graph capture / replay when the whole step is on one GPU.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "core/log.h"
#include "model/context_impl.h"

namespace kiln::model {

using backend::Binary;
using backend::DeviceType;

int Context::Impl::dev_index(backend::Device& d) {
  if (d.type() == DeviceType::Cpu) return 0;
  for (size_t i = 1; i < devs.size(); ++i)
    if (devs[i].dev == &d) return int(i);
  devs.emplace_back();
  devs.back().dev = &d;
  return int(devs.size() - 1);
}

Context::Impl::Impl(const Model& model, ThreadPool& pool, const ContextOptions& o) : m(model), c(model.config()), opt(o) {
  const int64_t B = opt.n_batch;
  n_out_max = opt.n_outputs_max > 0 ? std::min(opt.n_outputs_max, B) : B;
  host = backend::make_cpu_device(pool);
  devs.reserve(2);
  devs.emplace_back();
  devs[0].dev = host.get();
  for (int64_t il = 0; il < c.n_layer; ++il) layer_dev.push_back(dev_index(model.layer_device(il)));
  out_dev = dev_index(model.output_device());
  for (int i : layer_dev) devs[size_t(i)].layers = true;
  devs[size_t(out_dev)].output = true;
  if (opt.mtp) {
    KILN_CHECK(!m.mtp.empty(), "ContextOptions::mtp: {} has no MTP block", m.file().path());
    mtp_dev = dev_index(model.mtp_device());
    devs[size_t(mtp_dev)].mtp = true;
    devs[0].mtp = true;  // the host gathers the block's token embeddings
  }
  // Expert weights kept on another device than their block's (model/placement.h): that device runs them.
  bool split_experts = false;
  for (int64_t il = 0; il < c.n_layer + (opt.mtp ? c.n_nextn : 0); ++il) {
    const int home = il < c.n_layer ? layer_dev[size_t(il)] : mtp_dev;
    expert_dev.push_back(dev_index(model.expert_device(il)));
    if (expert_dev.back() != home) devs[size_t(expert_dev.back())].experts = split_experts = true;
  }
  graph_step = devs.size() == 2 && !devs[0].layers && out_dev == 1 && !split_experts;
  runs.reserve(size_t(B));
  out_idx.reserve(size_t(B));
  backend::Device& od = *devs[size_t(out_dev)].dev;
  logits_n = size_t(c.n_vocab) * size_t(n_out_max);
  logits_host = od.alloc_host(logits_n * sizeof(float));
  logits = static_cast<float*>(logits_host->host_ptr());
  KILN_CHECK(opt.n_top >= 0 && opt.n_top <= 128, "ContextOptions::n_top {} outside [0, 128]", opt.n_top);
  n_top = int(std::min<int64_t>(opt.n_top, c.n_vocab));
  fetched.assign(size_t(n_out_max), 0);
  if (n_top > 0 && od.type() != DeviceType::Cpu) {
    top_host = od.alloc_host(size_t(n_top) * size_t(n_out_max) * 8);
    top_ids = static_cast<int32_t*>(top_host->host_ptr());
    top_vals = reinterpret_cast<float*>(top_ids + size_t(n_top) * size_t(n_out_max));
  }
  if (opt.mtp && graph_step) {
    const size_t n = size_t(n_out_max);
    draft_host = od.alloc_host((2 * size_t(kDraftGraphMax) * n + size_t(c.n_embd) * n) * 4);
    draft_ids = static_cast<int32_t*>(draft_host->host_ptr());
    draft_p = reinterpret_cast<float*>(draft_ids + size_t(kDraftGraphMax) * n);
    draft_emb = draft_p + size_t(kDraftGraphMax) * n;
  }
  if (opt.embeddings) {
    embd_host = od.alloc_host(size_t(c.n_embd) * size_t(n_out_max) * sizeof(float));
    embd = static_cast<float*>(embd_host->host_ptr());
  }
  for (Dev& d : devs) {
    d.st = d.dev->create_stream();
    if (opt.batch_invariant) d.st->set_batch_invariant(true);  // before the workspaces are sized
    plan(d);
    d.arena.allocate(*d.dev);
    reserve(d);
  }
  if (out_dev == 0) logits_buf = host->wrap(logits, logits_n * sizeof(float));
}

// Scratch of one device (model/scratch.h, the layout the memory planner counts).
void Context::Impl::plan(Dev& d) {
  const ScratchRole role{d.dev->type() == DeviceType::Cpu, d.layers, d.output, d.mtp, d.experts, d.output ? n_top : 0,
                        runs_mtp(d)};
  plan_scratch(c, opt.n_batch, n_out_max, role, d.arena, d.plan);
}

// Workspaces (rule 4): the largest any op on this device needs at n_batch tokens (model/scratch.h);
// attention's is added in decode() once the Memory's n_ctx is known.
void Context::Impl::reserve(Dev& d) {
  const gguf::File& f = m.file();
  const TensorLookup find = [&f](const std::string& n) { return f.find_tensor(n); };
  std::vector<MatShape> mats;
  int64_t n_rec = 0;
  // A block's mat-muls where they run: the expert stacks on their weights' device, the rest on the block's.
  auto add_block = [&](int64_t il, bool here) {
    const bool experts_here = &devs[size_t(expert_dev[size_t(il)])] == &d;
    for (const MatShape& ms : layer_mats(find, il))
      if (ms.expert ? experts_here : here) mats.push_back(ms);
  };
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const bool here = &devs[size_t(layer_dev[size_t(il)])] == &d;
    add_block(il, here);
    n_rec += here && c.is_recurrent(il) ? 1 : 0;
  }
  if (opt.mtp) add_block(c.n_layer, runs_mtp(d));
  if (runs_mtp(d)) {  // the MTP block: eh_proj (its layer's mat-muls above)
    const LayerWeights& L = m.mtp[0];
    mats.push_back({L.nextn_eh_proj.type, L.nextn_eh_proj.ne[0], L.nextn_eh_proj.ne[1], false});
  }
  if (opt.mtp && d.output) {  // its head matrix, with the output
    const LayerWeights& L = m.mtp[0];
    if (L.nextn_shared_head_head.present())
      mats.push_back({L.nextn_shared_head_head.type, L.nextn_shared_head_head.ne[0], L.nextn_shared_head_head.ne[1], false});
  }
  const MatShape out{m.output.type, m.output.ne[0], m.output.ne[1], false};
  d.ws = step_workspace(*d.st, c, mats, n_rec, d.output ? &out : nullptr, opt.n_batch, n_out_max, opt.delta_chunk_min,
                        d.output ? n_top : 0);
  d.st->reserve_workspace(d.ws);
}

void Context::Impl::bind(Dev& d, int64_t T, int64_t n_out) {
  const Plan& p = d.plan;
  const backend::Arena& A = d.arena;
  // [w, T] views (w as planned).
  auto act = [&](size_t off, int64_t w) {
    return off == Plan::kNone ? Tensor{} : A.tensor(off, gguf::GgmlType::F32, {std::max<int64_t>(w, 1), T, 1, 1});
  };
  auto i32 = [&](size_t off, int64_t n) { return off == Plan::kNone ? Tensor{} : A.tensor(off, gguf::GgmlType::I32, {n, 1, 1, 1}); };
  const int64_t E = c.n_embd, D = c.head_dim, K = std::max<int64_t>(1, c.n_expert_used);
  const bool hybrid = arch_is_hybrid(c.arch);
  const int64_t ff = std::max({c.n_ff, c.n_ff_shexp, c.n_ff_exp * K});
  Act& a = d.a;
  a.x = act(p.x, E);
  a.cur = act(p.cur, E);
  a.tmp = act(p.tmp, E);
  a.q = act(p.q, (hybrid ? 2 : 1) * D * c.n_head);
  a.k = act(p.k, D * c.n_head_kv);
  a.v = act(p.v, D * c.n_head_kv);
  a.att = act(p.att, D * c.n_head);
  a.fa = act(p.fa, ff);
  a.fb = act(p.fb, ff);
  a.mixed = act(p.mixed, c.ssm_conv_dim());
  a.z = act(p.z, c.ssm_value_dim());
  a.beta = act(p.beta, c.ssm_dt_rank);
  a.g = act(p.g, c.ssm_dt_rank);
  a.dout = act(p.dout, c.ssm_value_dim());
  a.router = act(p.router, c.n_expert);
  a.ids = p.ids == Plan::kNone ? Tensor{} : A.tensor(p.ids, gguf::GgmlType::I32, {K, T, 1, 1});
  a.wts = act(p.wts, K);
  a.ye = act(p.ye, E * K);
  a.pos = i32(p.pos, T);
  a.seq = i32(p.seq, T);
  a.rseq = i32(p.rseq, T);
  a.keep = i32(p.keep, T);
  a.mpos = Tensor{};
  d.tok = i32(p.tok, T);
  d.out_idx = i32(p.out_idx, std::max<int64_t>(n_out, 1));
  d.hidden = p.hidden == Plan::kNone ? Tensor{} : A.tensor(p.hidden, gguf::GgmlType::F32, {E, n_out, 1, 1});
  if (d.mtp) {
    const int64_t E = c.n_embd;
    d.emb = act(p.emb, E);
    d.hall = act(p.hall, E);
    d.hprev = p.hprev == Plan::kNone ? Tensor{} : A.tensor(p.hprev, gguf::GgmlType::F32, {E, T + 1, 1, 1});
    d.cat = act(p.cat, 2 * E);
    // The MTP indices of this step, [T] each, back to back in one region (one upload per step).
    d.hidx = d.hsrc = d.hshift = d.hdst = d.hzero = d.hring = Tensor{};
    if (p.hidx != Plan::kNone) {
      d.hidx = A.tensor(p.hidx, gguf::GgmlType::I32, {5 * T, 1, 1, 1});
      Tensor* v[] = {&d.hsrc, &d.hshift, &d.hdst, &d.hzero, &d.hring};
      for (int k = 0; k < 5; ++k) *v[k] = A.tensor(p.hidx + size_t(k * T) * 4, gguf::GgmlType::I32, {T, 1, 1, 1});
    }
    d.dids = p.dids == Plan::kNone ? Tensor{} : A.tensor(p.dids, gguf::GgmlType::I32, {1, std::max<int64_t>(n_out, 1), 1, 1});
    d.dprob = p.dprob == Plan::kNone ? Tensor{} : A.tensor(p.dprob, gguf::GgmlType::F32, {1, std::max<int64_t>(n_out, 1), 1, 1});
  }
  if (p.top_ids != Plan::kNone) {
    d.top_ids = A.tensor(p.top_ids, gguf::GgmlType::I32, {n_top, std::max<int64_t>(n_out, 1), 1, 1});
    d.top_vals = A.tensor(p.top_vals, gguf::GgmlType::F32, {n_top, std::max<int64_t>(n_out, 1), 1, 1});
  }
  if (d.output)
    d.logits = p.logits != Plan::kNone ? A.tensor(p.logits, gguf::GgmlType::F32, {c.n_vocab, n_out, 1, 1})
                                       : Tensor::make(logits_buf.get(), 0, gguf::GgmlType::F32, {c.n_vocab, n_out, 1, 1});
}

// Whether layer il's last residual add is fused with layer il + 1's attn_norm (add_rms_norm): when
// both layers run on the same device (no activation move between them).
bool Context::Impl::fused_with_next(int64_t il) const {
  return il + 1 < c.n_layer && layer_dev[size_t(il)] == layer_dev[size_t(il + 1)];
}

// One layer. The residual adds and the norms after them are add_rms_norm (binary Add then rms_norm
// on the CPU: the same calls as ever); the norm of layer il's input is the previous layer's when it
// ran on this device (fused_with_next), else its own rms_norm here.
void Context::Impl::run_layer(Dev& d, int64_t il, Memory& mem, int64_t T) {
  const LayerWeights& L = m.layers[size_t(il)];
  backend::Stream& st = *d.st;
  Dev& e = experts_of(il);
  const Step xs{*e.st, e.a, c, opt, T};
  const Step s{st, d.a, c, opt, T, &e != &d ? &xs : nullptr};
  if (il == 0 || !fused_with_next(il - 1)) st.rms_norm(d.a.x, &L.attn_norm.t, d.a.cur, c.rms_eps);
  if (c.is_recurrent(il)) delta_net(s, L, il, mem);
  else if (arch_is_hybrid(c.arch)) gated_attention(s, L, il, mem);
  else dense_attention(s, L, il, mem);
  st.add_rms_norm(d.a.x, d.a.tmp, &L.ffn_norm.t, d.a.cur, c.rms_eps);
  if (c.arch == Arch::Qwen35Moe) moe_ffn(s, L);
  else dense_ffn(s, L);
  if (fused_with_next(il))
    st.add_rms_norm(d.a.x, d.a.tmp, &m.layers[size_t(il + 1)].attn_norm.t, d.a.cur, c.rms_eps);
  else st.binary(Binary::Add, d.a.x, d.a.tmp, d.a.x);
}

// The output rows of x (gathered by index), normed, times the output matrix.
void Context::Impl::run_output(Dev& d, int64_t T, int64_t n_out) {
  if (n_out == 0) return;
  d.st->get_rows(d.a.x, d.out_idx, d.hidden);
  d.st->rms_norm(d.hidden, &m.output_norm.t, d.hidden, c.rms_eps);
  d.st->matmul(m.output.t, d.hidden, d.logits);
  if (n_top > 0) d.st->top_logits(d.logits, n_top, d.top_ids, d.top_vals);
}

// The residual stream [E, T] from one device to another: download + synchronize + upload (one of
// the two is the host, whose memory the other side reads or writes directly).
void Context::Impl::move_x(Dev& from, Dev& to, int64_t T) {
  const size_t bytes = size_t(c.n_embd * T) * sizeof(float);
  const bool from_host = from.dev->type() == DeviceType::Cpu, to_host = to.dev->type() == DeviceType::Cpu;
  KILN_CHECK(from_host || to_host, "moving activations between two GPUs is not supported");
  if (from_host) {
    to.st->upload(to.a.x, from.a.x.host(), bytes);
  } else {
    from.st->download(to.a.x.host(), from.a.x, bytes);
    from.st->synchronize();
  }
}

void Context::Impl::reserve_attention(const Memory& mem) {
  if (mem.n_ctx() <= n_kv_reserved) return;
  n_kv_reserved = mem.n_ctx();
  for (Dev& d : devs)
    if ((d.layers && c.n_attn_layers() > 0) || runs_mtp(d)) {
      d.ws = std::max(d.ws, attention_step_workspace(*d.st, c, opt.n_batch, n_kv_reserved, opt.flash_attn));
      d.st->reserve_workspace(d.ws);
    }
}

Context::Context(const Model& model, const ContextOptions& opt) : model_(model), opt_(opt) {
  KILN_CHECK(opt_.n_batch > 0, "n_batch must be positive");
  pool_ = std::make_unique<ThreadPool>(opt_.n_threads);
  impl_ = std::make_unique<Impl>(model_, *pool_, opt_);
}

Context::~Context() = default;

const float* Context::embedding(int64_t i) const {
  KILN_CHECK(opt_.embeddings, "embedding({}): the context was created without ContextOptions::embeddings", i);
  KILN_CHECK(i >= 0 && i < n_out_, "embedding({}) with {} outputs", i, n_out_);
  return impl_->embd + size_t(i) * size_t(model_.config().n_embd);
}

std::vector<Context::DeviceUse> Context::memory_use() const {
  std::vector<DeviceUse> out;
  for (const Impl::Dev& d : impl_->devs) {
    DeviceUse u;
    u.device = d.dev;
    u.arena = d.arena.planned();
    u.workspace = d.ws;
    if (d.dev->type() == DeviceType::Cpu)
      u.logits = impl_->logits_n * sizeof(float) + (impl_->top_host ? impl_->top_host->size() : 0);
    out.push_back(u);
  }
  return out;
}

const float* Context::logits(int64_t i) const {
  KILN_CHECK(i >= 0 && i < n_out_, "logits({}) with {} outputs", i, n_out_);
  Impl& s = *impl_;
  const int64_t V = model_.config().n_vocab;
  float* row = s.logits + size_t(i) * size_t(V);
  if (!s.rows_on_host && !s.fetched[size_t(i)]) {  // n_top on a GPU: this row on first use
    Impl::Dev& o = s.devs[size_t(s.out_dev)];
    const Tensor src = Tensor::make(o.logits.buf, o.logits.offset + size_t(i * V) * sizeof(float),
                                    gguf::GgmlType::F32, {V, 1, 1, 1});
    o.st->download(row, src, size_t(V) * sizeof(float));
    o.st->synchronize();
    s.fetched[size_t(i)] = 1;
  }
  return row;
}

bool Context::top_logits(int64_t i, TopLogits& out) const {
  const Impl& s = *impl_;
  if (!s.top_valid) return false;
  KILN_CHECK(i >= 0 && i < n_out_, "top_logits({}) with {} outputs", i, n_out_);
  out.id = s.top_ids + size_t(i) * size_t(s.n_top);
  out.logit = s.top_vals + size_t(i) * size_t(s.n_top);
  out.n = s.n_top;
  return true;
}

Status Context::decode(const Batch& b, Memory& mem) {
  Impl& s = *impl_;
  const ModelConfig& c = model_.config();
  const int64_t T = b.size();
  n_out_ = 0;
  if (T == 0) return {};
  if (T > opt_.n_batch) return err("batch of {} tokens exceeds n_batch {}", T, opt_.n_batch);
  if (int64_t(b.pos.size()) != T || int64_t(b.seq.size()) != T || int64_t(b.output.size()) != T ||
      (!b.keep.empty() && int64_t(b.keep.size()) != T))
    return err("batch arrays have different lengths");
  // Split into runs and validate.
  s.runs.clear();
  const bool has_embd = !b.embd.empty();
  if (has_embd && int64_t(b.embd.size()) != T) return err("batch embd has {} entries for {} tokens", b.embd.size(), T);
  const bool mrope = !b.mpos.empty();
  if (mrope && int64_t(b.mpos.size()) != 3 * T) return err("batch mpos has {} entries for {} tokens", b.mpos.size(), T);
  if (mrope && s.devs[size_t(s.layer_dev.empty() ? 0 : s.layer_dev[0])].plan.mpos == ScratchPlan::kNone)
    return err("batch has M-RoPE positions but the model has no rope sections ({})", c.arch_str);
  for (int64_t t = 0; t < T; ++t) {
    if (!(has_embd && b.embd[size_t(t)]) && (b.token[size_t(t)] < 0 || b.token[size_t(t)] >= c.n_vocab))
      return err("batch token {}: id {} outside the vocabulary [0, {})", t, b.token[size_t(t)], c.n_vocab);
    const int32_t sq = b.seq[size_t(t)];
    if (sq < 0 || sq >= mem.n_seq()) return err("batch token {}: sequence {} outside [0, {})", t, sq, mem.n_seq());
    if (!s.runs.empty() && s.runs.back().seq == sq) {
      Run& r = s.runs.back();
      if (b.pos[size_t(t)] != r.pos0 + r.n)
        return err("batch token {}: sequence {} position {} does not follow {}", t, sq, b.pos[size_t(t)], r.pos0 + r.n - 1);
      ++r.n;
      continue;
    }
    for (const Run& r : s.runs)
      if (r.seq == sq) return err("batch token {}: sequence {} appears in two separate runs", t, sq);
    s.runs.push_back({sq, t, 1, b.pos[size_t(t)]});
  }
  for (const Run& r : s.runs) {
    const int64_t have = mem.seq_pos(r.seq);
    if (r.pos0 < 0 || r.pos0 > have || (r.pos0 != have && mem.has_recurrent()))
      return err("sequence {}: run starts at position {} but the memory holds {} positions{}", r.seq, r.pos0, have,
                 mem.has_recurrent() ? " (recurrent state: runs must continue exactly)" : "");
    if (r.pos0 + r.n > mem.n_ctx())
      return err("sequence {}: positions up to {} exceed the context size {}", r.seq, r.pos0 + r.n - 1, mem.n_ctx());
  }
  s.rseq.clear();
  s.keep.clear();
  if (mem.has_recurrent() && mem.n_spec() == 0)
    for (size_t t = 0; t < b.keep.size(); ++t)
      if (b.keep[t]) return err("batch token {}: keeps its state but the memory has no keep slots (MemoryOptions::n_spec)", t);
  if (mem.has_recurrent() && mem.n_spec() > 0)  // else the slots are the sequences (qwen35.cpp)
    for (const Run& r : s.runs)
      for (int64_t i = 0; i < r.n; ++i) {
        s.rseq.push_back(mem.rec_slot(r.seq));
        const bool kp = !b.keep.empty() && b.keep[size_t(r.t0 + i)];
        if (kp && i >= mem.n_spec())
          return err("batch token {}: keeps the state of token {} of its run but the memory has {} keep slots "
                     "(MemoryOptions::n_spec)", r.t0 + i, i, mem.n_spec());
        s.keep.push_back(kp ? mem.rec_keep_slot(r.seq, int(i)) : -1);
      }
  s.out_idx.clear();
  for (int64_t t = 0; t < T; ++t)
    if (b.output[size_t(t)]) s.out_idx.push_back(int32_t(t));
  const int64_t n_out = int64_t(s.out_idx.size());
  if (n_out > s.n_out_max)
    return err("batch asks for {} output rows, the context holds {} (n_outputs_max)", n_out, s.n_out_max);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    backend::Device &md = mem.layer_device(il), &ld = model_.layer_device(il);
    if (&md != &ld && !(md.type() == DeviceType::Cpu && ld.type() == DeviceType::Cpu))
      return err("layer {} runs on {} but its memory is on {} (create the Memory from the Model)", il, ld.name(),
                 md.name());
  }
  s.mtp_defer = false;
  if (opt_.mtp) KILN_TRY(s.mtp_prepare(b, mem));
  // Attention workspaces for this memory's context length (once per longer n_ctx).
  s.reserve_attention(mem);

  // Per-batch inputs, uploaded once; the embeddings on the host.
  for (Impl::Dev& d : s.devs) s.bind(d, T, n_out);
  Impl::Dev& h = s.devs[0];
  Impl::Dev& o = s.devs[size_t(s.out_dev)];
  const int32_t* ids = b.token.data();
  if (has_embd) {
    s.tok_ids.assign(b.token.begin(), b.token.end());
    for (int64_t t = 0; t < T; ++t)
      if (b.embd[size_t(t)]) s.tok_ids[size_t(t)] = 0;
    ids = s.tok_ids.data();
  }
  if (mrope) {
    s.mpos.assign(size_t(4 * T), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < 3; ++k) s.mpos[size_t(k * T + t)] = b.mpos[size_t(3 * t + k)];
  }
  h.st->upload(h.tok, ids, size_t(T) * 4);
  for (Impl::Dev& d : s.devs)
    if (d.layers || s.runs_mtp(d)) {
      d.st->upload(d.a.pos, b.pos.data(), size_t(T) * 4);
      d.st->upload(d.a.seq, b.seq.data(), size_t(T) * 4);
      if (d.a.rseq.buf && !s.rseq.empty()) {
        d.st->upload(d.a.rseq, s.rseq.data(), size_t(T) * 4);
        d.st->upload(d.a.keep, s.keep.data(), size_t(T) * 4);
      }
      if (mrope) {
        d.a.mpos = d.arena.tensor(d.plan.mpos, gguf::GgmlType::I32, {T, 4, 1, 1});
        d.st->upload(d.a.mpos, s.mpos.data(), size_t(4 * T) * 4);
      }
    }
  if (n_out > 0) o.st->upload(o.out_idx, s.out_idx.data(), size_t(n_out) * 4);
  h.st->get_rows(model_.token_embd.t, h.tok, h.a.x);
  if (has_embd) {
    // Image tokens: their embeddings replace the looked-up rows (the host stream ran get_rows already).
    h.st->synchronize();
    float* x = h.a.x.host_as<float>();
    for (int64_t t = 0; t < T; ++t)
      if (b.embd[size_t(t)]) std::memcpy(x + t * c.n_embd, b.embd[size_t(t)], size_t(c.n_embd) * 4);
  }
  const bool mtp = opt_.mtp;
  Impl::Dev& md = s.devs[size_t(s.mtp_dev)];
  if (mtp) {  // the MTP block's embeddings (not read by a deferred step) and per-token indices, on its device
    const LayerWeights& L = model_.mtp[0];
    if (!s.mtp_defer) {
      h.st->get_rows(L.nextn_embed_tokens.present() ? L.nextn_embed_tokens.t : model_.token_embd.t, h.tok, h.emb);
      if (&md != &h) md.st->upload(md.emb, h.emb.host(), size_t(c.n_embd * T) * sizeof(float));
    }
    md.st->upload(md.hidx, s.hidx.data(), size_t(5 * T) * 4);
  }

  if (s.graph_step) {
    Impl::Dev& g = s.devs[1];
    s.move_x(h, g, T);
    auto step = [&] {
      for (int64_t il = 0; il < c.n_layer; ++il) s.run_layer(g, il, mem, T);
      s.run_output(g, T, n_out);
      if (mtp) s.mtp_catchup(g, mem, T);
    };
    if (s.graph_mem != mem.id()) {  // graphs hold a Memory's buffer addresses: only for that one
      s.graphs.clear();
      s.graph_mem = mem.id();
    }
    // Graphs pay off where launches dominate: decode steps (one output row per token: every row a
    // sequence's next token or a verified draft). Steps with prompt tokens (n_out < T) and larger
    // batches run op by op, so the map holds at most one graph per T <= kGraphMaxTokens (and RoPE
    // kind): recording every (T, n_out) mix a busy server meets grew device and host memory without
    // bound (run 80: +196 MiB GPU, +657 MiB RSS in 8 minutes of 32 clients).
    if (s.graphs_unsupported || T > kGraphMaxTokens || n_out != T) {
      step();
    } else {
      auto it = s.graphs.find({T, n_out, mrope, s.mtp_defer});
      if (it == s.graphs.end()) {
        auto gr = g.st->capture(step);
        if (!gr) {
          s.graphs_unsupported = true;
          KILN_LOG_INFO("{}: no graph capture; the step runs op by op", g.dev->name());
          step();
        } else {
          it = s.graphs.emplace(std::tuple{T, n_out, mrope, s.mtp_defer}, std::move(gr)).first;
          KILN_LOG_DEBUG("{}: step graph recorded for {} tokens ({} held)", g.dev->name(), T, s.graphs.size());
        }
      }
      if (it != s.graphs.end()) g.st->replay(*it->second);
    }
  } else {
    int cur = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const int d = s.layer_dev[size_t(il)];
      if (d != cur) s.move_x(s.devs[size_t(cur)], s.devs[size_t(d)], T);
      cur = d;
      s.run_layer(s.devs[size_t(d)], il, mem, T);
    }
    // The output rows and the MTP catch-up both read x, and the catch-up overwrites it. The MTP block
    // runs where the last layer ran (cur): with the output there too, the output runs first; with the
    // output elsewhere (the host), x moves first (a move to the host synchronizes) and the GPU's
    // catch-up is queued before the host computes the output rows.
    if (n_out > 0 && s.out_dev != cur) s.move_x(s.devs[size_t(cur)], o, T);
    const bool apart = s.mtp_dev != s.out_dev;
    if (mtp && apart) s.mtp_catchup(md, mem, T);
    s.run_output(o, T, n_out);
    if (mtp && !apart) s.mtp_catchup(md, mem, T);
  }
  // The rows' top logits only (n_top), or every logits row, to the host.
  const bool on_gpu = o.dev->type() != DeviceType::Cpu;
  s.rows_on_host = !on_gpu || s.n_top == 0;
  s.top_valid = s.n_top > 0 && n_out > 0;
  std::fill_n(s.fetched.begin(), n_out, uint8_t(0));
  if (n_out > 0 && on_gpu && s.n_top > 0) {
    const size_t nt = size_t(s.n_top) * size_t(n_out);
    o.st->download(s.top_ids, o.top_ids, nt * 4);
    o.st->download(s.top_vals, o.top_vals, nt * 4);
  } else if (n_out > 0 && on_gpu) {
    o.st->download(s.logits, o.logits, size_t(c.n_vocab * n_out) * sizeof(float));
  } else if (s.top_valid) {  // the host's output: its Arena holds them
    s.top_ids = o.top_ids.host_as<int32_t>();
    s.top_vals = o.top_vals.host_as<float>();
  }
  if (n_out > 0 && opt_.embeddings) o.st->download(s.embd, o.hidden, size_t(c.n_embd * n_out) * sizeof(float));
  for (Impl::Dev& d : s.devs) d.st->synchronize();
  for (const Run& r : s.runs) {
    // The MTP rows now computed: a run's own unless deferred, and only where the rows before it were.
    const int64_t done = mem.mtp_done(r.seq);
    mem.set_decoded(r.seq, r.pos0 + r.n, mtp && !s.mtp_defer && done >= r.pos0 ? r.pos0 + r.n : done);
  }
  n_out_ = n_out;
  return {};
}

}  // namespace kiln::model
