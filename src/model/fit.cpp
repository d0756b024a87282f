// model/fit.cpp — the memory planner and fitting (see fit.h). Every size that an allocation makes
// comes from the allocator's own function (Memory::layout, plan_scratch, step_workspace,
// backend::workspace_sizes, packed_weight_bytes); what is counted here is where each part goes.
#include "model/fit.h"
#include "model/vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "core/thread_pool.h"
#include "model/memory.h"
#include "model/scratch.h"

namespace kiln::model {
namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
// Device memory the CUDA runtime takes beyond the buffers counted elsewhere: kiln's cuBLAS handles
// and the recorded step graphs (one per decode shape of at most 64 tokens; 40 of a 9B step measured
// at ~2 MiB in all on an H100, run 73): a stated reserve.
constexpr uint64_t kCudaRuntimeReserve = uint64_t(32) << 20;

double mib(uint64_t b) { return double(b) / double(kMiB); }

// Tensors of block `il` ("blk.<il>.*"), by the block index in their name.
std::map<int64_t, std::vector<const gguf::TensorInfo*>> tensors_by_block(const gguf::File& f) {
  std::map<int64_t, std::vector<const gguf::TensorInfo*>> out;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const size_t dot = t.name.find('.', 4);
    if (dot == std::string::npos) continue;
    int64_t il = 0;
    bool ok = dot > 4;
    for (size_t i = 4; i < dot && ok; ++i) {
      ok = std::isdigit(static_cast<unsigned char>(t.name[i])) != 0;
      il = il * 10 + (t.name[i] - '0');
    }
    if (ok) out[il].push_back(&t);
  }
  return out;
}

uint64_t packed(const std::vector<const gguf::TensorInfo*>& ts) {
  std::vector<uint64_t> sizes;
  for (const auto* t : ts) sizes.push_back(bound_weight_bytes(*t));
  return packed_weight_bytes(sizes);
}

uint64_t file_bytes(const std::vector<const gguf::TensorInfo*>& ts) {
  uint64_t n = 0;
  for (const auto* t : ts) n += t->n_bytes;
  return n;
}

std::string type_str(gguf::GgmlType t) {
  std::string s(gguf::type_name(t));
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

// ---- shapes ----

Result<ModelShape> ModelShape::from_file(const gguf::File& f) {
  ModelShape m;
  m.path = f.path();
  m.file = &f;
  auto c = load_config(f);
  KILN_TRY(c);
  m.cfg = std::move(*c);
  const gguf::TensorInfo* te = f.find_tensor("token_embd.weight");
  if (!te) return err("{}: tensor 'token_embd.weight' is missing", f.path());
  if (m.cfg.n_vocab == 0) m.cfg.n_vocab = te->ne[1];
  m.cfg.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return m;
}

Result<ProjectorShape> ProjectorShape::from_file(const gguf::File& f) {
  ProjectorShape p;
  p.path = f.path();
  for (const auto& t : f.tensors()) p.weight_bytes += t.n_bytes;
  if (p.weight_bytes == 0) return err("{}: --mmproj: the file has no tensors", f.path());
  auto vc = VisionConfig::from_file(f);  // the loader's own reading and checks of the clip.* keys
  KILN_TRY(vc);
  p.n_embd = vc->n_embd, p.n_ff = vc->n_ff, p.n_head = vc->n_head, p.patch_size = vc->patch, p.merge = vc->merge;
  // The merger's widest layer (mm.0 or a DeepStack fc1) and one more output per DeepStack layer.
  p.n_mff = std::max(vc->n_merger_ff, vc->n_ds_ff);
  p.n_out_total = vc->n_out_total();
  if (p.n_mff <= 0 || p.n_out_total <= 0)
    return err("{}: --mmproj: the merger's widths (mm.0 / mm.2 rows) must be positive", f.path());
  return p;
}

// ---- small rules shared with the engine and the loader ----

int64_t resolve_total_context(int64_t n_ctx, int64_t n_ctx_train) {
  return n_ctx > 0 ? n_ctx : (n_ctx_train > 0 ? n_ctx_train : 4096);
}
int64_t slot_context(int64_t total, int n_parallel) { return std::max<int64_t>(1, total / std::max(1, n_parallel)); }
int64_t step_tokens(int64_t n_batch, int64_t n_ubatch, int n_parallel) {
  return std::max<int64_t>(std::min(n_batch > 0 ? n_batch : 2048, n_ubatch > 0 ? n_ubatch : 512), n_parallel);
}
int resolve_gpu_layers(int n_gpu_layers, int64_t n_layer, bool have_gpu) {
  if (!have_gpu) return 0;
  if (n_gpu_layers == kGpuLayersAuto || n_gpu_layers < 0) return int(n_layer + 1);
  return int(std::min<int64_t>(n_gpu_layers, n_layer + 1));
}

uint64_t DeviceBudget::available() const { return cap > 0 ? std::min(free + context, cap) : free + context; }
uint64_t DeviceBudget::usable() const {
  const uint64_t avail = available();
  return avail > target ? avail - target : 0;
}

uint64_t MemoryPlan::host_total() const {
  uint64_t n = 0;
  for (const auto& p : parts) n += p.host;
  return n;
}
uint64_t MemoryPlan::gpu_total() const {
  uint64_t n = 0;
  for (const auto& p : parts) n += p.gpu;
  return n;
}

// ---- the plan ----

Result<MemoryPlan> plan_memory(const ModelShape& m, const ProjectorShape* proj, const PlanOptions& o, int ngl,
                               const std::optional<DeviceBudget>& gpu) {
  const ModelConfig& c = m.cfg;
  MemoryPlan p;
  p.model = m.path;
  p.n_layer = c.n_layer;
  p.gpu = gpu;
  p.n_gpu_layers = gpu ? std::clamp<int>(ngl, 0, int(c.n_layer + 1)) : 0;
  p.output_on_gpu = p.n_gpu_layers > c.n_layer;
  p.n_parallel = std::max(1, o.n_parallel);
  p.n_rec_cache = c.n_recurrent_layers() > 0 ? o.n_rec_cache : 0;
  p.n_ctx = resolve_total_context(o.n_ctx, c.n_ctx_train);
  p.n_ctx_slot = slot_context(p.n_ctx, p.n_parallel);
  p.n_ubatch = o.n_ubatch > 0 ? o.n_ubatch : 512;
  p.n_step = step_tokens(o.n_batch, p.n_ubatch, p.n_parallel);
  const int64_t first_gpu = c.n_layer - std::min<int64_t>(p.n_gpu_layers, c.n_layer);
  auto on_gpu = [&](int64_t il) { return il >= first_gpu; };
  const int64_t n_out = o.n_outputs_max > 0 ? std::min(o.n_outputs_max, p.n_step) : p.n_step;
  const auto blocks = tensors_by_block(*m.file);
  auto block = [&](int64_t il) {
    auto it = blocks.find(il);
    return it == blocks.end() ? std::vector<const gguf::TensorInfo*>{} : it->second;
  };
  auto add = [&](std::string name, std::string detail, uint64_t host, uint64_t g, bool estimate = false) {
    p.parts.push_back({std::move(name), std::move(detail), host, g, estimate});
  };

  // Where the expert tensors go (model/placement.h: the loader's decision on the same tensor table).
  const BlockDevices bd = BlockDevices::of(c, p.n_gpu_layers, o.spec_mtp, o.main_gpu);
  auto experts = place_experts(*m.file, c, bd, o.placement);
  KILN_TRY(experts);
  p.n_cpu_moe = o.placement.n_cpu_moe;
  p.n_expert_host = experts->n_host();
  // A GPU block's weights as the loader uploads them: one packed buffer of the tensors that go
  // there; `host_experts` gets the file bytes of expert tensors that stay in the mapping.
  uint64_t host_experts = 0;
  auto gpu_block = [&](int64_t il) {
    std::vector<const gguf::TensorInfo*> up;
    for (const gguf::TensorInfo* t : block(il)) {
      if (experts->on_host(il) && is_expert_tensor(t->name)) host_experts += t->n_bytes;
      else up.push_back(t);
    }
    return packed(up);
  };

  // Weights: host tensors stay in the mapping (file bytes); GPU layers are uploaded packed per layer.
  {
    const gguf::TensorInfo* te = m.find("token_embd.weight");
    const gguf::TensorInfo* on = m.find("output_norm.weight");
    const gguf::TensorInfo* out = m.find("output.weight");
    uint64_t host = te ? te->n_bytes : 0, g = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      if (on_gpu(il)) g += gpu_block(il);
      else host += file_bytes(block(il));
    }
    std::vector<const gguf::TensorInfo*> head;
    if (on) head.push_back(on);
    head.push_back(out ? out : te);
    if (p.output_on_gpu) g += packed(head);
    else host += (on ? on->n_bytes : 0) + (out ? out->n_bytes : 0);
    add("weights",
        fmt::format("{} of {} layers{} on the GPU; token_embd on the host", p.n_gpu_layers > c.n_layer ? c.n_layer : p.n_gpu_layers,
                    c.n_layer, p.output_on_gpu ? " + output" : ""),
        host, g);
    const int64_t n_trunk = experts->n_host_trunk(c.n_layer);
    if (n_trunk > 0)
      add("expert weights", fmt::format("ffn_{{gate,up,down}}_exps of {} GPU layer(s) kept on the host{}", n_trunk,
                                        p.n_cpu_moe >= kCpuMoeAll ? " (--cpu-moe)"
                                        : p.n_cpu_moe > 0         ? fmt::format(" (--n-cpu-moe {})", p.n_cpu_moe)
                                                                  : std::string(" (-ot)")),
          host_experts, 0);
  }

  // KV cache and recurrent state (Memory::layout), on each layer's device.
  MemoryOptions mo;
  mo.n_ctx = p.n_ctx_slot;
  mo.n_seq = p.n_parallel;
  mo.type_k = o.type_k;
  mo.type_v = o.type_v;
  mo.n_spec = o.n_spec;
  mo.n_rec_cache = o.n_rec_cache;
  auto lay = Memory::layout(c, mo);
  KILN_TRY(lay);
  {
    uint64_t kh = 0, kg = 0, rh = 0, rg = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const bool rec = c.is_recurrent(il);
      uint64_t& dst = rec ? (on_gpu(il) ? rg : rh) : (on_gpu(il) ? kg : kh);
      dst += rec ? lay->rec_layer_bytes : lay->attn_layer_bytes;
    }
    if (lay->n_attn > 0)
      add("KV cache", fmt::format("{} attention layers x {} slot(s) x {} positions, K {} / V {}", lay->n_attn,
                                  p.n_parallel, p.n_ctx_slot, type_str(o.type_k), type_str(o.type_v)),
          kh, kg);
    // Memory's page-locked staging for a state's host copies, where recurrent layers are on the GPU.
    if (rg > 0) rh += uint64_t(lay->state_floats(o.spec_mtp, c.n_embd)) * sizeof(float);
    if (lay->n_rec > 0)
      add("recurrent state",
          fmt::format("{} delta-net layers x {} slot(s){}{} (conv + SSM, f32)", lay->n_rec, p.n_parallel,
                      o.n_spec > 0 ? fmt::format(" x (1 + {} speculative keep states)", o.n_spec) : std::string(),
                      o.n_rec_cache > 0 ? fmt::format(" + {} prefix-cache states", o.n_rec_cache) : std::string()),
          rh, rg);
  }

  // Context: one scratch Arena and one workspace per device it runs on (model/scratch.h).
  const bool gpu_layers = p.n_gpu_layers > 0 && gpu;
  const bool host_layers = first_gpu > 0;
  const bool split_experts = p.n_expert_host > 0;  // the host runs GPU blocks' experts (routed_experts)
  const auto find = [&m](const std::string& n) { return m.find(n); };
  uint64_t scratch[2] = {0, 0}, logits[2] = {0, 0}, ws[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    const bool host = d == 0;
    if (!host && !gpu_layers) continue;
    const bool output = host ? !p.output_on_gpu : p.output_on_gpu;
    const int n_top = output ? int(std::min<int64_t>(o.n_top, c.n_vocab)) : 0;
    const ScratchRole role{host, host ? host_layers : true, output, false, host && split_experts, n_top};
    backend::Arena arena;
    ScratchPlan sp;
    plan_scratch(c, p.n_step, n_out, role, arena, sp);
    const uint64_t lg = sp.logits != ScratchPlan::kNone ? uint64_t(c.n_vocab) * uint64_t(n_out) * 4 : 0;
    scratch[d] = arena.planned() - lg;
    logits[d] = lg;
    if (host) logits[d] += uint64_t(c.n_vocab) * uint64_t(n_out) * 4;  // Context's host logits vector
    if (!host && n_top > 0) logits[0] += uint64_t(n_top) * uint64_t(n_out) * 8;  // their top logits, page-locked
    const auto sizes = backend::workspace_sizes(host ? backend::DeviceType::Cpu : backend::DeviceType::Cuda, o.n_threads);
    std::vector<MatShape> mats;
    int64_t n_rec = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const bool here = on_gpu(il) != host, experts_here = experts->on_host(il) ? host : here;
      for (const MatShape& ms : layer_mats(find, il))
        if (ms.expert ? experts_here : here) mats.push_back(ms);
      n_rec += here && c.is_recurrent(il) ? 1 : 0;
    }
    const auto om = output_mat(find);
    size_t w = step_workspace(*sizes, c, mats, n_rec, role.output && om ? &*om : nullptr, p.n_step, n_out,
                              o.delta_chunk_min, n_top);
    if (role.layers) w = std::max(w, attention_step_workspace(*sizes, c, p.n_step, p.n_ctx_slot, o.flash_attn));
    ws[d] = host ? (w + 63) & ~size_t(63) : (w + 255) & ~size_t(255);  // as the streams round their allocation
  }
  add("compute scratch", fmt::format("activations for {} tokens per step", p.n_step), scratch[0], scratch[1]);
  add("logits", fmt::format("{} vocabulary x {} output rows, f32", c.n_vocab, n_out), logits[0], logits[1]);
  add("op workspaces", "largest mat-mul / attention / delta-rule workspace", ws[0], ws[1]);
  if (gpu_layers) {
    add("CUDA streams", "cuBLAS workspace of the Context's and the Memory's stream", 0,
        2 * backend::cuda_stream_fixed_bytes(gpu->sm));
    add("CUDA runtime", "cuBLAS handles, recorded step graphs", 0, kCudaRuntimeReserve, true);
  }

  // The MTP head (--spec-type draft-mtp): its blocks with the last trunk layer (on the GPU whenever a
  // layer is), one attention layer of KV each, and the draft's own rows; as the loader places them, its
  // embedding table stays on the host and its head matrix (nextn.shared_head_head, or the output)
  // multiplies with the output, and a GPU copy of output_norm serves it when the output is on the host.
  if (o.spec_mtp) {
    if (c.n_nextn <= 0)
      return err("{}: --spec-type draft-mtp: the model has no MTP block ('{}.nextn_predict_layers' is 0 or missing)",
                 m.path, c.arch_str);
    const bool g = bd.mtp_on_gpu;
    uint64_t host = 0, dev = 0;
    for (int64_t i = 0; i < c.n_nextn; ++i) {
      std::vector<const gguf::TensorInfo*> up;
      for (const gguf::TensorInfo* t : block(c.n_layer + i)) {
        const bool stays = t->name.ends_with("nextn.embed_tokens.weight") ||
                           (!p.output_on_gpu && t->name.ends_with("nextn.shared_head_head.weight")) ||
                           (experts->on_host(c.n_layer + i) && is_expert_tensor(t->name));
        if (!g || stays) host += t->n_bytes;
        else up.push_back(t);
      }
      dev += packed(up);
    }
    if (g && !p.output_on_gpu) dev += packed_weight_bytes({uint64_t(c.n_embd) * 4});  // output_norm's copy
    add("MTP head",
        fmt::format("blk.{}.* ({} block(s)), with the last layer{}", c.n_layer, c.n_nextn,
                    g && !p.output_on_gpu ? "; its head matrix with the output on the host" : ""),
        host, dev);
    // Its KV, and the trunk's hidden states it pairs tokens with: one per recurrent state slot, a scratch
    // column, and each slot's ring for the deferred catch-up (Memory::layout's mtp_h_bytes).
    MemoryOptions mm = mo;
    mm.mtp = true;
    auto ml = Memory::layout(c, mm);
    KILN_TRY(ml);
    const uint64_t kv = uint64_t(c.n_nextn) * lay->attn_layer_bytes + ml->mtp_h_bytes;
    add("MTP KV", fmt::format("{} attention layer(s) x {} slot(s) x {} positions + hidden states ({} per slot for "
                              "the deferred catch-up)", c.n_nextn, p.n_parallel, p.n_ctx_slot, Memory::kMtpRing),
        g ? 0 : kv, g ? kv : 0);
    // The block's [2E, step] input where it runs, the draft rows' logits with the output, and with
    // both on the GPU the recorded drafts' page-locked rows (model/scratch.h kDraftGraphMax).
    const uint64_t in = 4 * uint64_t(2 * c.n_embd) * uint64_t(p.n_step);
    const uint64_t rows = 4 * uint64_t(c.n_vocab) * uint64_t(o.n_draft + 1) * uint64_t(p.n_parallel);
    const uint64_t pinned = p.output_on_gpu ? 4 * uint64_t(2 * kDraftGraphMax + c.n_embd) * uint64_t(n_out) : 0;
    add("MTP draft scratch", fmt::format("[2E, step] input + {} draft logits rows per slot", o.n_draft + 1),
        (g ? 0 : in) + (p.output_on_gpu ? pinned : rows), (g ? in : 0) + (p.output_on_gpu ? rows : 0), true);
  }

  // The projector (--mmproj): on the GPU whenever layers are there (llama-server's --mmproj-offload).
  if (proj) {
    const bool g = gpu_layers;
    add("projector", proj->path, g ? 0 : proj->weight_bytes, g ? proj->weight_bytes : 0);
    // The encoder's own scratch plan (model/vision.h vision_arena) for the largest image.
    const int64_t n_patch = o.image_max_tokens * proj->merge * proj->merge;
    VisionDims d;
    d.n_embd = proj->n_embd, d.n_ff = proj->n_ff, d.n_head = proj->n_head, d.patch = proj->patch_size;
    d.n_mff = proj->n_mff, d.n_out_total = proj->n_out_total;
    const uint64_t img = VisionEncoder::scratch_bytes(d, n_patch, g ? backend::DeviceType::Cuda : backend::DeviceType::Cpu) +
                         (g ? backend::cuda_stream_fixed_bytes(gpu->sm) : 0);
    add("image batch",
        fmt::format("{} patches (one image of {} tokens): 3 x [{}, patches] f32, K/V {}, chunks of {}, workspaces{}",
                    n_patch, o.image_max_tokens, proj->n_embd, g ? "f16" : "f32", kVisionChunk, g ? ", its stream" : ""),
        g ? 0 : img, g ? img : 0);
  }

  // The prefix cache's blocks and snapshots live in host RAM, bounded by --cache-ram.
  if (o.cache_ram_bytes > 0) add("prefix cache", "--cache-ram", uint64_t(o.cache_ram_bytes), 0);
  else if (o.cache_ram_bytes < 0) add("prefix cache", "--cache-ram -1: unlimited (not counted)", 0, 0);

  // The draft model of --spec-type draft-simple, as engine/draft_model.cpp sizes it.
  if (o.draft) {
    PlanOptions d;
    d.n_ctx = p.n_ctx;  // the target's context: the draft holds the same sequences
    d.n_parallel = p.n_parallel;
    d.n_batch = d.n_ubatch = std::max<int64_t>(p.n_step, int64_t(p.n_parallel) * (o.n_draft + 2));
    d.n_outputs_max = p.n_parallel;
    d.type_k = o.draft_type_k, d.type_v = o.draft_type_v;
    d.n_threads = o.n_threads, d.delta_chunk_min = o.delta_chunk_min, d.flash_attn = o.flash_attn;
    d.n_spec = int(o.n_draft) + 1;
    const int dngl = resolve_gpu_layers(o.draft_n_gpu_layers, o.draft->cfg.n_layer, gpu.has_value());
    std::optional<DeviceBudget> dgpu = gpu;  // one context for both models: counted once, below
    if (dgpu) dgpu->context = 0;
    auto dp = plan_memory(*o.draft, nullptr, d, dngl, dgpu);
    if (!dp.ok()) return err("-md/--model-draft {}: {}", o.draft->path, dp.error().message);
    for (PlanPart& part : dp->parts)
      if (part.host > 0 || part.gpu > 0) {
        part.name = "draft " + part.name;
        if (part.name == "draft weights")
          part.detail = fmt::format("{} ({} of {} layers on the GPU)", o.draft->path, std::min<int64_t>(dngl, o.draft->cfg.n_layer),
                                    o.draft->cfg.n_layer);
        p.parts.push_back(std::move(part));
      }
  }
  // The process's CUDA context, wherever anything runs on the GPU (a real device's free memory is
  // already net of it; a --device-memory cap holds it).
  if (gpu && gpu->context > 0 && p.gpu_total() > 0)
    add("CUDA context", "driver, local memory for every resident thread, kernels loaded on use (docs/memory.md)", 0,
        gpu->context, true);
  return p;
}

std::string MemoryPlan::table() const {
  const std::string dev = gpu ? gpu->name : "GPU";
  std::string s;
  std::string where;
  if (!gpu) where = "all on the CPU";
  else if (n_gpu_layers > n_layer) where = fmt::format("all {} layers and the output on {}", n_layer, dev);
  else where = fmt::format("{} of {} layers on {}", n_gpu_layers, n_layer, dev);
  if (n_expert_host > 0) where += fmt::format("; the expert tensors of {} of them on the host", n_expert_host);
  s += fmt::format("memory plan for {}: -ngl {} ({}), context {} ({} slot(s) x {}), {} tokens per step\n", model,
                   n_gpu_layers, where, n_ctx, n_parallel, n_ctx_slot, n_step);
  s += fmt::format("  {:<22} {:>12} {:>12}  {}\n", "part", "host MiB", dev + " MiB", "counted as");
  for (const auto& p : parts)
    s += fmt::format("  {:<22} {:>12.1f} {:>12.1f}  {}{}\n", p.name, mib(p.host), mib(p.gpu), p.detail,
                     p.estimate ? " (estimate)" : "");
  s += fmt::format("  {:<22} {:>12.1f} {:>12.1f}\n", "total", mib(host_total()), mib(gpu_total()));
  if (gpu) {
    s += fmt::format("  {}: {:.1f} MiB {} - {:.1f} MiB target = {:.1f} MiB usable; the plan needs {:.1f} MiB: {}\n", dev,
                     mib(gpu->available()),
                     gpu->cap > 0 && gpu->available() == gpu->cap ? "(--device-memory)" : "free + kiln's context",
                     mib(gpu->target),
                     mib(gpu->usable()), mib(gpu_total()), fits() ? "fits" : "does NOT fit");
  }
  return s;
}

std::string MemoryPlan::gpu_parts() const {
  std::string s;
  for (const auto& p : parts)
    if (p.gpu > 0) s += fmt::format("{}{} {:.1f} MiB", s.empty() ? "" : ", ", p.name, mib(p.gpu));
  return s;
}

// ---- fitting ----

// fit_plan with a given -ub.
static Result<MemoryPlan> fit_plan_ub(const ModelShape& m, const ProjectorShape* proj, const PlanOptions& o,
                                      const FitOptions& f, const std::optional<DeviceBudget>& gpu) {
  const ModelConfig& c = m.cfg;
  const bool auto_ngl = o.n_gpu_layers == kGpuLayersAuto;
  // Experts move only when nothing about their placement was asked for (llama-server's fit: n_cpu_moe).
  const bool auto_experts = auto_ngl && !o.placement.given() && c.n_expert > 0;
  const int ngl0 = resolve_gpu_layers(o.n_gpu_layers, c.n_layer, gpu.has_value());
  auto first = plan_memory(m, proj, o, ngl0, gpu);
  KILN_TRY(first);
  // Prefix-cache state slots left to fitting: where the plan fits, up to 10 % of the usable GPU memory
  // (at most 256); where it does not, none (they are a speed-up: context and layers come first).
  const bool auto_states = gpu && f.fit && o.rec_cache_auto && first->n_rec_cache > 0;
  if (auto_states && first->fits()) {
    PlanOptions more = o;
    more.n_rec_cache = o.n_rec_cache + 1;
    auto p1 = plan_memory(m, proj, more, ngl0, gpu);
    KILN_TRY(p1);
    const uint64_t per = p1->gpu_total() - first->gpu_total(), share = gpu->usable() / 10;
    const uint64_t have = uint64_t(o.n_rec_cache) * per;
    if (per > 0 && share > have) {
      more.n_rec_cache = int(std::min<uint64_t>(256, uint64_t(o.n_rec_cache) + (share - have) / per));
      auto grown = plan_memory(m, proj, more, ngl0, gpu);
      KILN_TRY(grown);
      if (grown->fits()) return grown;
    }
  }
  if (!gpu || !f.fit || first->fits()) return first;
  if (auto_states) {  // everything below plans without the slots
    PlanOptions none = o;
    none.n_rec_cache = 0;
    return fit_plan_ub(m, proj, none, f, gpu);
  }
  // A context left unset: the largest (a multiple of 256, at least --fit-ctx) that fits with ngl0.
  const int64_t total = resolve_total_context(o.n_ctx, c.n_ctx_train);
  PlanOptions po = o;
  // po.n_ctx fits with ngl (and po's placement): the largest multiple of 256 up to `total` that does.
  auto grow_context = [&](int ngl) -> Result<MemoryPlan> {
    int64_t lo = po.n_ctx, hi = total;  // lo fits
    po.n_ctx = total;
    auto top = plan_memory(m, proj, po, ngl, gpu);
    KILN_TRY(top);
    if (top->fits()) return top;
    while (hi - lo > 256) {  // hi does not fit
      const int64_t mid = (lo + (hi - lo) / 2) / 256 * 256;
      if (mid <= lo) break;
      po.n_ctx = mid;
      auto pm = plan_memory(m, proj, po, ngl, gpu);
      KILN_TRY(pm);
      (pm->fits() ? lo : hi) = mid;
    }
    po.n_ctx = lo;
    return plan_memory(m, proj, po, ngl, gpu);
  };
  if (o.n_ctx == 0) {
    po.n_ctx = std::min<int64_t>(std::max<int64_t>(f.fit_ctx, 1), total);
    auto low = plan_memory(m, proj, po, ngl0, gpu);
    KILN_TRY(low);
    if (low->fits()) return grow_context(ngl0);
  } else {
    po.n_ctx = o.n_ctx;
  }
  // MoE: the expert tensors of the first N blocks to the host, the smallest N that fits (every block
  // with experts counts: the MTP blocks after the trunk); an unset context then grows back.
  if (auto_experts) {
    const int n_blocks = int(c.n_layer + c.n_nextn);
    for (int n = 1; n <= n_blocks; ++n) {
      po.placement.n_cpu_moe = n;
      auto pn = plan_memory(m, proj, po, ngl0, gpu);
      KILN_TRY(pn);
      if (pn->fits()) return o.n_ctx == 0 ? grow_context(ngl0) : pn;
    }
    po.placement.n_cpu_moe = kCpuMoeAll;  // then layers, each GPU layer's experts on the host
  }
  // Then layers: the most that fit (0 always does: nothing is then on the GPU).
  if (auto_ngl)
    for (int n = ngl0 - 1; n >= 0; --n) {
      auto pn = plan_memory(m, proj, po, n, gpu);
      KILN_TRY(pn);
      if (pn->fits()) return pn;
    }
  auto bad = plan_memory(m, proj, po, ngl0, gpu);
  KILN_TRY(bad);
  std::string hints;
  if (!auto_ngl) hints += "; -ngl auto (or fewer layers) lets fit choose";
  if (c.n_expert > 0 && !auto_experts && bad->n_expert_host < c.n_layer)
    hints += "; --cpu-moe / --n-cpu-moe N keep expert tensors on the host";
  if (o.n_ctx > 0) hints += fmt::format("; a smaller -c (now {}) or leaving it unset", o.n_ctx);
  if (o.type_k == gguf::GgmlType::F16 || o.type_v == gguf::GgmlType::F16) hints += "; -ctk/-ctv q8_0 halve the KV cache";
  return err("{}: the plan does not fit {}: it needs {:.1f} MiB and {:.1f} MiB are usable ({} target {:.1f} MiB): {}{}",
             m.path, gpu->name, mib(bad->gpu_total()), mib(gpu->usable()),
             gpu->cap > 0 ? "--device-memory / free memory minus the" : "free memory minus the --fit-target",
             mib(gpu->target), bad->gpu_parts(), hints);
}

Result<MemoryPlan> fit_plan(const ModelShape& m, const ProjectorShape* proj, const PlanOptions& o, const FitOptions& f,
                            const std::optional<DeviceBudget>& gpu) {
  if (o.n_ubatch != kUbatchAuto) return fit_plan_ub(m, proj, o, f, gpu);
  PlanOptions small = o;
  small.n_ubatch = 512;
  auto p = fit_plan_ub(m, proj, small, f, gpu);
  KILN_TRY(p);
  // -ub auto: large steps only where everything (every layer, its experts, the output) is on the GPU and the
  // plan fitted at 512 keeps fitting with them (the same context, layers and cache slots).
  if (!gpu || !f.fit || !p->fits() || !p->output_on_gpu || p->n_expert_host > 0 ||
      step_tokens(o.n_batch, kUbatchLarge, p->n_parallel) <= p->n_step)
    return p;
  PlanOptions large = small;
  large.n_ubatch = kUbatchLarge;
  large.n_ctx = p->n_ctx;
  large.n_rec_cache = p->n_rec_cache;
  auto q = plan_memory(m, proj, large, p->n_gpu_layers, gpu);
  KILN_TRY(q);
  return q->fits() ? q : p;
}

// ---- flags ----

Result<uint64_t> parse_memory_size(const std::string& s, const char* what) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return err("{} '{}': expected a size such as 8GiB, 24G, 8192MiB or a byte count", what, s);
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    return err("{} '{}': expected a number", what, s);
  }
  std::string u = s.substr(i);
  for (char& ch : u) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mul = 1;
  if (u.empty() || u == "b") mul = 1;
  else if (u == "k" || u == "kb" || u == "kib") mul = 1024.0;
  else if (u == "m" || u == "mb" || u == "mib") mul = 1024.0 * 1024;
  else if (u == "g" || u == "gb" || u == "gib") mul = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb" || u == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else return err("{} '{}': unknown unit '{}' (K, M, G, T: binary units)", what, s, s.substr(i));
  return uint64_t(v * mul);
}

Result<std::vector<uint64_t>> parse_fit_target(const std::string& s) {
  std::vector<uint64_t> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    const std::string tok = s.substr(b, e - b);
    int64_t v = -1;
    try {
      size_t used = 0;
      v = std::stoll(tok, &used);
      if (used != tok.size()) v = -1;
    } catch (...) {
    }
    if (v < 0) return err("--fit-target '{}': expected MiB[,MiB...] (non-negative integers)", s);
    out.push_back(uint64_t(v) * kMiB);
    b = e + 1;
  }
  return out;
}

std::optional<DeviceBudget> gpu_budget(int main_gpu, uint64_t device_memory, uint64_t target, bool simulate) {
  DeviceBudget b;
  b.target = target;
  b.cap = device_memory;
  backend::CudaMemoryInfo info;
  if (backend::cuda_device_count() > main_gpu && backend::cuda_memory_info(main_gpu, &info)) {
    b.name = fmt::format("CUDA{}", main_gpu);
    b.free = info.free;
    b.sm = info.sm;
    b.context = info.context;
    return b;
  }
  if (!simulate || device_memory == 0) return std::nullopt;
  b.name = fmt::format("CUDA{} (simulated)", main_gpu);
  b.free = device_memory;
  b.context = backend::cuda_context_bytes({});  // an RTX 4090's SMs (the larger of the users' cards)
  return b;
}

}  // namespace kiln::model
