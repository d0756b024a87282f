// The memory planner (model/fit.h) without a GPU:
//  - its numbers against sizes computed by hand here from the shapes (KV per cache type, recurrent
//    state, weights per device by llama-server's -ngl rule) on metadata-only files of the real
//    Qwen3.5 shapes (`kiln gguf gen --meta-only`);
//  - the two users' configurations: Qwen3.5-9B IQ4_XS at 64K context with a projector of
//    Qwen3.5-9B's size on an 8 GiB card; Qwen3.5-27B Q4_K_M with a q4_0 cache at 262144 positions on
//    24 GiB; impossible requests fail with every GPU part named;
//  - the plan's CPU numbers equal what a CPU Context and Memory actually allocate (Arena, workspace,
//    logits, KV / recurrent buffers, weights), for every architecture, so the planner cannot drift
//    from the allocations.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gguf/writer.h"
#include "model/context.h"
#include "model/fit.h"
#include "model/gen/gen.h"
#include "model/memory.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tensor/quant.h"

namespace kiln::model {
namespace {

namespace fs = std::filesystem;
using gguf::GgmlType;
constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;

fs::path tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("kiln_test_model_fit_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// A metadata-only file of a preset (no tensor data) and its shape.
struct Meta {
  std::unique_ptr<gguf::File> file;
  ModelShape shape;
  std::vector<gen::PlannedTensor> tensors;  // the generator's own plan (independent sizes)
};
Meta meta_model(const std::string& preset, gen::Mix mix, int64_t n_mtp) {
  gen::GenOptions o;
  o.spec = gen::find_preset(preset)->spec;
  o.spec.n_mtp = n_mtp;
  o.mix = mix;
  test::MetaModel mm = test::meta_model(tmp_dir() / (preset + ".meta.gguf"), o);
  return {std::move(mm.file), std::move(mm.shape), *gen::plan(o)};
}

// A metadata-only projector with Qwen3.5-9B's vision tower (depth 27, width 1152, FFN 4304, patch 16
// with 2 frames, 2x2 merge into 4096: the HF vision_config) in F16 with F32 norms and biases.
// Returns the path and the bytes of its tensors.
std::pair<std::string, uint64_t> qwen35_9b_projector() {
  gguf::Writer w;
  w.set_string("general.architecture", "clip");
  w.set_string("clip.projector_type", "qwen3vl_merger");
  w.set_u32("clip.vision.embedding_length", 1152);
  w.set_u32("clip.vision.feed_forward_length", 4304);
  w.set_u32("clip.vision.attention.head_count", 16);
  w.set_u32("clip.vision.patch_size", 16);
  w.set_u32("clip.vision.spatial_merge_size", 2);
  w.set_u32("clip.vision.block_count", 27);
  uint64_t bytes = 0;
  auto add = [&](const std::string& name, GgmlType t, std::vector<int64_t> ne) {
    EXPECT_TRUE(w.add_tensor(name, t, ne, nullptr).ok()) << name;
    uint64_t n = 1;
    for (size_t i = 1; i < ne.size(); ++i) n *= uint64_t(ne[i]);
    bytes += n * tensor::row_size(t, ne[0]);
  };
  const int64_t E = 1152, F = 4304, M = 4 * E, O = 4096;
  add("v.patch_embd.weight", GgmlType::F16, {16, 16, 3, E});
  add("v.patch_embd.weight.1", GgmlType::F16, {16, 16, 3, E});
  add("v.position_embd.weight", GgmlType::F16, {E, 2304});
  for (int i = 0; i < 27; ++i) {
    const std::string p = "v.blk." + std::to_string(i) + ".";
    add(p + "attn_qkv.weight", GgmlType::F16, {E, 3 * E});
    add(p + "attn_qkv.bias", GgmlType::F32, {3 * E});
    add(p + "attn_out.weight", GgmlType::F16, {E, E});
    add(p + "attn_out.bias", GgmlType::F32, {E});
    add(p + "ln1.weight", GgmlType::F32, {E});
    add(p + "ln1.bias", GgmlType::F32, {E});
    add(p + "ln2.weight", GgmlType::F32, {E});
    add(p + "ln2.bias", GgmlType::F32, {E});
    add(p + "ffn_up.weight", GgmlType::F16, {E, F});
    add(p + "ffn_up.bias", GgmlType::F32, {F});
    add(p + "ffn_down.weight", GgmlType::F16, {F, E});
    add(p + "ffn_down.bias", GgmlType::F32, {E});
  }
  add("v.post_ln.weight", GgmlType::F32, {E});
  add("v.post_ln.bias", GgmlType::F32, {E});
  add("mm.0.weight", GgmlType::F16, {M, M});
  add("mm.0.bias", GgmlType::F32, {M});
  add("mm.2.weight", GgmlType::F16, {M, O});
  add("mm.2.bias", GgmlType::F32, {O});
  const fs::path p = tmp_dir() / "mmproj-qwen35-9b.meta.gguf";
  EXPECT_TRUE(w.write(p.string(), {}, /*meta_only=*/true).ok());
  return {p.string(), bytes};
}

const PlanPart* part(const MemoryPlan& p, const std::string& name) {
  for (const auto& x : p.parts)
    if (x.name == name) return &x;
  return nullptr;
}

DeviceBudget card(uint64_t bytes) {
  DeviceBudget b;
  b.name = "CUDA0 (simulated)";
  b.free = b.cap = bytes;
  return b;
}

// The CUDA context (docs/memory.md): the driver's 262 MiB + the local memory of every resident thread
// + 128 MiB of kernels loaded on use; counted as a plan part and, on a real device, added back to the
// free memory the driver reports after it exists; a --device-memory cap holds it.
TEST(ModelFit, CudaContextIsAPartOfThePlan) {
  const char* ml = std::getenv("CUDA_MODULE_LOADING");
  const bool had = ml != nullptr;
  const std::string saved = had ? ml : "";
  ::unsetenv("CUDA_MODULE_LOADING");
  EXPECT_EQ(backend::cuda_context_bytes({132, 2048, 1024}), (262 + 264 + 128) * kMiB);  // H100 / H200
  EXPECT_EQ(backend::cuda_context_bytes({}), (262 + 192 + 128) * kMiB);               // RTX 4090 (default)
  EXPECT_EQ(backend::cuda_context_bytes({24, 1536, 1024}), (262 + 36 + 128) * kMiB);  // RTX 4060
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);  // every module loaded at start: a larger reserve
  EXPECT_EQ(backend::cuda_context_bytes({24, 1536, 1024}), (262 + 36 + 640) * kMiB);
  if (had) ::setenv("CUDA_MODULE_LOADING", saved.c_str(), 1);
  else ::unsetenv("CUDA_MODULE_LOADING");
  DeviceBudget real;
  real.free = 20 * kGiB, real.context = 600 * kMiB, real.target = kGiB;
  EXPECT_EQ(real.available(), 20 * kGiB + 600 * kMiB);
  EXPECT_EQ(real.usable(), 19 * kGiB + 600 * kMiB);
  real.cap = 8 * kGiB;
  EXPECT_EQ(real.usable(), 7 * kGiB);
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 0);
  PlanOptions o;
  o.n_ctx = 8192;
  DeviceBudget c8 = card(8 * kGiB);
  c8.context = backend::cuda_context_bytes({});
  auto p = plan_memory(m.shape, nullptr, o, 33, c8);
  auto p0 = plan_memory(m.shape, nullptr, o, 33, card(8 * kGiB));
  ASSERT_TRUE(p.ok() && p0.ok());
  ASSERT_NE(part(*p, "CUDA context"), nullptr);
  EXPECT_EQ(part(*p, "CUDA context")->gpu, c8.context);
  EXPECT_EQ(p->gpu_total(), p0->gpu_total() + c8.context);
  EXPECT_EQ(p->gpu->usable(), 7 * kGiB);  // the cap holds the context: the parts get less room
  auto cpu_only = plan_memory(m.shape, nullptr, o, 0, c8);  // nothing on the GPU: no context
  ASSERT_TRUE(cpu_only.ok());
  EXPECT_EQ(part(*cpu_only, "CUDA context"), nullptr);
}

TEST(ModelFit, KvAndRecurrentStateAsComputedByHand) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 0);
  ASSERT_EQ(m.shape.cfg.n_layer, 32);
  PlanOptions o;
  o.n_ctx = 65536;
  o.n_gpu_layers = kGpuLayersAll;
  // 8 attention layers (every 4th of 32), 4 KV heads of 256: bytes per position and layer = 4 x row.
  struct Case {
    GgmlType t;
    uint64_t row;  // bytes of one 256-element row
  };
  for (Case c : {Case{GgmlType::F16, 512}, Case{GgmlType::Q8_0, 8 * 34}, Case{GgmlType::Q4_0, 8 * 18}}) {
    o.type_k = o.type_v = c.t;
    auto p = plan_memory(m.shape, nullptr, o, 33, card(80 * kGiB));
    ASSERT_TRUE(p.ok()) << p.error().message;
    const uint64_t kv = 8 * 2 * (4 * c.row * 65536);
    EXPECT_EQ(part(*p, "KV cache")->gpu, kv) << gguf::type_name(c.t);
    EXPECT_EQ(part(*p, "KV cache")->host, 0u);
  }
  EXPECT_EQ(uint64_t(8 * 2 * 4 * 512) * 65536, 2 * kGiB);  // f16: 2 GiB at 64K
  // Recurrent state: 24 delta-net layers; conv (d_conv - 1) x conv_dim (2*16*128 + 32*128) f32 and
  // SSM 128 x 128 x 32 heads f32 per slot; the SSM state starts at a 256-byte boundary.
  o.n_parallel = 3;
  auto p = plan_memory(m.shape, nullptr, o, 33, card(80 * kGiB));
  ASSERT_TRUE(p.ok());
  const uint64_t conv = 3 * 8192 * 4 * 3, ssm = 128 * 128 * 32 * 4 * 3;
  EXPECT_EQ(part(*p, "recurrent state")->gpu, 24 * ((conv + 255) / 256 * 256 + ssm));
  EXPECT_EQ(p->n_ctx_slot, 65536 / 3);
}

TEST(ModelFit, WeightsFollowTheLayerCount) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 1);
  const int64_t L = m.shape.cfg.n_layer;
  // Independent sums from the generator's tensor plan: file bytes per block and of the rest.
  std::vector<uint64_t> block_packed(size_t(L) + 1, 0), block_file(size_t(L) + 1, 0);
  uint64_t embd = 0, out = 0, out_norm = 0;
  for (const auto& t : m.tensors) {
    if (t.name == "token_embd.weight") embd = t.n_bytes;
    else if (t.name == "output.weight") out = t.n_bytes;
    else if (t.name == "output_norm.weight") out_norm = t.n_bytes;
    else {
      const int64_t il = std::stoll(t.name.substr(4, t.name.find('.', 4) - 4));
      block_file[size_t(il)] += t.n_bytes;
      block_packed[size_t(il)] += (t.n_bytes + 255) / 256 * 256;  // the generator writes vectors as F32
    }
  }
  PlanOptions o;
  o.n_ctx = 4096;
  for (int ngl : {0, 1, 20, 32, 33}) {
    auto p = plan_memory(m.shape, nullptr, o, ngl, card(80 * kGiB));
    ASSERT_TRUE(p.ok());
    uint64_t host = embd, gpu = 0;
    const int64_t first = L - std::min<int64_t>(ngl, L);  // llama-server's rule: the last ngl layers
    for (int64_t il = 0; il < L; ++il) {
      if (il >= first) gpu += block_packed[size_t(il)];
      else host += block_file[size_t(il)];
    }
    if (ngl > L) gpu += (out_norm + 255) / 256 * 256 + (out + 255) / 256 * 256;
    else host += out_norm + out;
    EXPECT_EQ(part(*p, "weights")->host, host) << "-ngl " << ngl;
    EXPECT_EQ(part(*p, "weights")->gpu, gpu) << "-ngl " << ngl;
    EXPECT_EQ(part(*p, "MTP head"), nullptr);  // not requested
  }
  // --spec-type draft-mtp: blk.32.* with the last layer, and one more attention layer of KV: on the GPU
  // whenever a layer is (with the output on the host, plus the GPU copy of output_norm), else on the host.
  o.spec_mtp = true;
  // Its KV (one slot x 4096 positions x 4 heads x 256 x F16, K and V) and its hidden states: [4096] F32 per
  // recurrent state slot (1), a scratch column and the slot's deferred catch-up ring (Memory::kMtpRing).
  const uint64_t mtp_kv = 2 * (4 * 512 * 4096u) + 4096u * 4 * (1 + 1 + Memory::kMtpRing);
  for (int ngl : {33, 32, 1}) {
    auto p = plan_memory(m.shape, nullptr, o, ngl, card(80 * kGiB));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(part(*p, "MTP head")->gpu, block_packed[size_t(L)] + (ngl > L ? 0 : (out_norm + 255) / 256 * 256)) << ngl;
    EXPECT_EQ(part(*p, "MTP head")->host, 0u) << ngl;
    EXPECT_EQ(part(*p, "MTP KV")->gpu, mtp_kv) << ngl;
  }
  auto p = plan_memory(m.shape, nullptr, o, 0, card(80 * kGiB));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(part(*p, "MTP head")->host, block_file[size_t(L)]);
  EXPECT_EQ(part(*p, "MTP KV")->host, mtp_kv);
  EXPECT_EQ(part(*p, "MTP KV")->gpu, 0u);
  // A model without an MTP block cannot draft with one.
  Meta plain = meta_model("qwen35-0.8b", gen::Mix::Uniform, 0);
  auto q = plan_memory(plain.shape, nullptr, o, 25, card(80 * kGiB));
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("--spec-type draft-mtp"), std::string::npos);
}

// User 1: Qwen3.5-9B IQ4_XS, -c 65536, its projector, an 8 GiB card (llama-server's fit ignored the
// projector and the MTP head).
TEST(ModelFit, Qwen35_9B_64K_WithProjectorOn8GiB) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 1);
  auto [proj_path, proj_bytes] = qwen35_9b_projector();
  EXPECT_GT(proj_bytes, 800 * kMiB);  // ~456 M parameters in F16
  EXPECT_LT(proj_bytes, 1000 * kMiB);
  gguf::OpenOptions oo;
  oo.limits.metadata_only = true;
  auto pf = gguf::File::open(proj_path, oo);
  ASSERT_TRUE(pf.ok()) << pf.error().message;
  auto proj = ProjectorShape::from_file(**pf);
  ASSERT_TRUE(proj.ok()) << proj.error().message;
  EXPECT_EQ(proj->weight_bytes, proj_bytes);

  PlanOptions o;
  o.n_ctx = 65536;
  o.n_outputs_max = 1;
  o.spec_mtp = true;
  FitOptions f;
  const DeviceBudget gpu = card(8 * kGiB);
  // -ngl auto: the context is explicit, so layers go to the CPU until the plan fits.
  auto p = fit_plan(m.shape, &*proj, o, f, gpu);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->fits());
  EXPECT_EQ(p->n_ctx, 65536);
  EXPECT_LT(p->n_gpu_layers, 33);
  EXPECT_GT(p->n_gpu_layers, 0);
  EXPECT_EQ(part(*p, "projector")->gpu, proj_bytes);
  EXPECT_GT(part(*p, "image batch")->gpu, 0u);
  EXPECT_LE(p->gpu_total(), 7 * kGiB);
  // One more layer would not fit: fitting took the most.
  auto more = plan_memory(m.shape, &*proj, o, p->n_gpu_layers + 1, gpu);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->fits());
  // -ngl all with this context cannot fit: an error naming each GPU part, the projector included.
  o.n_gpu_layers = kGpuLayersAll;
  auto bad = fit_plan(m.shape, &*proj, o, f, gpu);
  ASSERT_FALSE(bad.ok());
  for (const char* w : {"weights", "KV cache", "projector", "image batch", "MTP head", "MTP KV", "does not fit"})
    EXPECT_NE(bad.error().message.find(w), std::string::npos) << w << " in: " << bad.error().message;
  // -c left unset: the context is lowered first (from the training context) and every layer stays.
  o.n_ctx = 0;
  auto ctx = fit_plan(m.shape, &*proj, o, f, gpu);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  EXPECT_EQ(ctx->n_gpu_layers, 33);
  EXPECT_LT(ctx->n_ctx, 262144);
  EXPECT_GE(ctx->n_ctx, f.fit_ctx);
  EXPECT_EQ(ctx->n_ctx % 256, 0);
  o.n_ctx = ctx->n_ctx + 256;
  auto over = plan_memory(m.shape, &*proj, o, 33, gpu);
  ASSERT_TRUE(over.ok());
  EXPECT_FALSE(over->fits());
}

// User 2: Qwen3.5-27B Q4_K_M, q4_0 cache, 262144 positions, a 24 GiB card.
TEST(ModelFit, Qwen35_27B_262K_Q4_0_On24GiB) {
  Meta m = meta_model("qwen35-27b", gen::Mix::Q4_K_M, 0);
  PlanOptions o;
  o.n_ctx = 262144;
  o.n_outputs_max = 1;
  o.type_k = o.type_v = GgmlType::Q4_0;
  auto p = fit_plan(m.shape, nullptr, o, FitOptions{}, card(24 * kGiB));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->fits());
  // 16 attention layers x 4 KV heads x 144-byte q4_0 rows x 262144 positions x (K + V) = 4.5 GiB.
  const uint64_t kv_layer = 2 * uint64_t(4 * 144) * 262144;
  uint64_t kv = 0;
  for (int64_t il = 0; il < 64; ++il)
    if (!m.shape.cfg.is_recurrent(il) && il >= 64 - std::min(p->n_gpu_layers, 64)) kv += kv_layer;
  EXPECT_EQ(part(*p, "KV cache")->gpu, kv);
  EXPECT_EQ(16 * kv_layer, uint64_t(4.5 * double(kGiB)));
  // With f16 the same context cannot stay on the GPU whole: -ngl all fails at once, naming the parts.
  o.type_k = o.type_v = GgmlType::F16;
  o.n_gpu_layers = kGpuLayersAll;
  auto bad = fit_plan(m.shape, nullptr, o, FitOptions{}, card(24 * kGiB));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("KV cache"), std::string::npos);
  EXPECT_NE(bad.error().message.find("-ctk/-ctv q8_0"), std::string::npos);
}

// Prefix-cache state slots left to fitting (kiln serve's default): where the plan fits they grow
// into at most 10 % of the usable GPU memory; where it does not they go first, before any layer.
TEST(ModelFit, CacheStateSlotsGrowIntoSpareMemoryAndGoFirst) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 0);
  PlanOptions o;
  o.n_ctx = 32768;
  o.n_rec_cache = 5;
  o.rec_cache_auto = true;
  const uint64_t state = 24 * ((3 * 8192 * 4 + 255) / 256 * 256 + 128 * 128 * 32 * 4);  // one slot, 24 layers
  auto big = fit_plan(m.shape, nullptr, o, FitOptions{}, card(80 * kGiB));
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_TRUE(big->fits());
  EXPECT_GT(big->n_rec_cache, 5);
  EXPECT_LE(uint64_t(big->n_rec_cache) * state, big->gpu->usable() / 10 + state);
  EXPECT_EQ(part(*big, "recurrent state")->gpu, uint64_t(1 + big->n_rec_cache) * state);
  // A card where the weights and this context just fit: no slots, every layer kept.
  auto base = plan_memory(m.shape, nullptr, o, 33, card(80 * kGiB));
  ASSERT_TRUE(base.ok());
  const uint64_t tight = base->gpu_total() - state + (uint64_t(1024) << 20);  // + the default target
  auto small = fit_plan(m.shape, nullptr, o, FitOptions{}, card(tight));
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_TRUE(small->fits());
  EXPECT_EQ(small->n_rec_cache, 0);
  EXPECT_EQ(small->n_gpu_layers, 33);
  // Asked for explicitly: kept as asked (here: layers go instead).
  o.rec_cache_auto = false;
  auto asked = fit_plan(m.shape, nullptr, o, FitOptions{}, card(tight));
  ASSERT_TRUE(asked.ok()) << asked.error().message;
  EXPECT_EQ(asked->n_rec_cache, 5);
  EXPECT_LT(asked->n_gpu_layers, 33);
}

// -ub auto (kUbatchAuto, kiln serve's default): steps of kUbatchLarge tokens where everything is on the GPU and
// the plan fitted at 512 still fits with them, else 512; never at the cost of context or layers.
TEST(ModelFit, UbatchAutoTakesLargeStepsOnlyWithRoom) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 0);
  PlanOptions o;
  o.n_ctx = 32768;
  o.n_ubatch = kUbatchAuto;
  auto big = fit_plan(m.shape, nullptr, o, FitOptions{}, card(80 * kGiB));
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_TRUE(big->fits());
  EXPECT_EQ(big->n_ubatch, kUbatchLarge);
  EXPECT_EQ(big->n_step, kUbatchLarge);
  EXPECT_EQ(big->n_gpu_layers, 33);
  PlanOptions o512 = o;
  o512.n_ubatch = 512;
  auto base = plan_memory(m.shape, nullptr, o512, 33, card(80 * kGiB));
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(base->n_step, 512);
  EXPECT_GT(part(*big, "compute scratch")->gpu, part(*base, "compute scratch")->gpu);
  // plan_memory alone takes auto as 512.
  auto plain = plan_memory(m.shape, nullptr, o, 33, card(80 * kGiB));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->n_ubatch, 512);
  EXPECT_EQ(plain->gpu_total(), base->gpu_total());
  // A card where the 512-token plan fits and the 2048-token one does not: 512, every layer kept.
  const uint64_t between = (base->gpu_total() + big->gpu_total()) / 2 + (uint64_t(1024) << 20);
  auto mid = fit_plan(m.shape, nullptr, o, FitOptions{}, card(between));
  ASSERT_TRUE(mid.ok()) << mid.error().message;
  EXPECT_EQ(mid->n_ubatch, 512);
  EXPECT_EQ(mid->n_gpu_layers, 33);
  EXPECT_EQ(mid->n_ctx, 32768);
  // An unset context is fitted first: on 8 GiB it takes the room and the steps stay at 512.
  PlanOptions unset = o;
  unset.n_ctx = 0;
  auto fitted = fit_plan(m.shape, nullptr, unset, FitOptions{}, card(8 * kGiB));
  ASSERT_TRUE(fitted.ok()) << fitted.error().message;
  EXPECT_LT(fitted->n_ctx, 262144);
  EXPECT_EQ(fitted->n_ubatch, 512);
  // Layers on the CPU (an explicit context too large for every layer): 512.
  PlanOptions part_gpu = o;
  part_gpu.n_ctx = 262144;
  auto some = fit_plan(m.shape, nullptr, part_gpu, FitOptions{}, card(8 * kGiB));
  ASSERT_TRUE(some.ok()) << some.error().message;
  EXPECT_LT(some->n_gpu_layers, 33);
  EXPECT_EQ(some->n_ubatch, 512);
  // The CPU and --fit off: 512; an explicit -ub is kept.
  auto cpu = fit_plan(m.shape, nullptr, o, FitOptions{}, std::nullopt);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->n_ubatch, 512);
  FitOptions off;
  off.fit = false;
  auto unfitted = fit_plan(m.shape, nullptr, o, off, card(80 * kGiB));
  ASSERT_TRUE(unfitted.ok());
  EXPECT_EQ(unfitted->n_ubatch, 512);
  PlanOptions given = o;
  given.n_ubatch = 1024;
  auto kept = fit_plan(m.shape, nullptr, given, FitOptions{}, card(80 * kGiB));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->n_ubatch, 1024);
  EXPECT_EQ(kept->n_step, 1024);
}

TEST(ModelFit, FitOffKeepsValuesAndNoGpuPlansTheCpu) {
  Meta m = meta_model("qwen35-9b", gen::Mix::IQ4_XS, 0);
  PlanOptions o;
  o.n_ctx = 65536;
  FitOptions off;
  off.fit = false;
  auto p = fit_plan(m.shape, nullptr, o, off, card(4 * kGiB));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_gpu_layers, 33);  // auto = all, unchecked
  EXPECT_FALSE(p->fits());
  auto cpu = fit_plan(m.shape, nullptr, o, FitOptions{}, std::nullopt);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->n_gpu_layers, 0);
  EXPECT_EQ(cpu->gpu_total(), 0u);
  EXPECT_EQ(part(*cpu, "KV cache")->host, 2 * kGiB);
}

TEST(ModelFit, SizesAndTargets) {
  EXPECT_EQ(*parse_memory_size("8GiB", "--device-memory"), 8 * kGiB);
  EXPECT_EQ(*parse_memory_size("24G", "--device-memory"), 24 * kGiB);
  EXPECT_EQ(*parse_memory_size("8192M", "--device-memory"), 8 * kGiB);
  EXPECT_EQ(*parse_memory_size("1.5GiB", "--device-memory"), 3 * kGiB / 2);
  EXPECT_EQ(*parse_memory_size("4096", "--device-memory"), 4096u);
  EXPECT_FALSE(parse_memory_size("8 apples", "--device-memory").ok());
  EXPECT_FALSE(parse_memory_size("", "--device-memory").ok());
  auto t = parse_fit_target("512,2048");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)[0], 512 * kMiB);
  EXPECT_EQ((*t)[1], 2048 * kMiB);
  EXPECT_FALSE(parse_fit_target("1024,x").ok());
  DeviceBudget b = card(8 * kGiB);
  b.free = 6 * kGiB;  // a real card with less free than the cap: the smaller counts
  EXPECT_EQ(b.usable(), 5 * kGiB);
  b.target = 7 * kGiB;
  EXPECT_EQ(b.usable(), 0u);
}

// The plan's CPU numbers are what a CPU Context and Memory allocate (all architectures).
class ModelFitCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelFitCpu, PlanEqualsTheAllocations) {
  const std::string preset = std::string("tiny-") + GetParam();
  const std::string path = test::generated_model("kiln_test_model_fit", preset, GgmlType::Q8_0, 3);
  LoadOptions lo;
  lo.n_gpu_layers = 0;
  auto m = load_model(path, lo);
  ASSERT_TRUE(m.ok()) << m.error().message;
  for (int64_t n_out : {int64_t(0), int64_t(2)}) {
    const int n_top = n_out == 2 ? 64 : 0;  // the rows' top logits too (ContextOptions::n_top)
    MemoryOptions mo;
    mo.n_ctx = 256;
    mo.n_seq = 2;
    mo.type_k = GgmlType::Q8_0;
    mo.type_v = GgmlType::F16;
    auto mem = Memory::create(**m, mo);
    ASSERT_TRUE(mem.ok()) << mem.error().message;
    ContextOptions co;
    co.n_batch = 48;
    co.n_threads = 2;
    co.n_outputs_max = n_out;
    co.n_top = n_top;
    Context cx(**m, co);
    Batch b;
    b.add_run(test::random_tokens(5, (*m)->config().n_vocab, 1), 0, 0, false);
    ASSERT_TRUE(cx.decode(b, **mem).ok());  // reserves attention's workspace for n_ctx

    auto shape = ModelShape::from_file((*m)->file());
    ASSERT_TRUE(shape.ok());
    PlanOptions o;
    o.n_ctx = 512;  // 2 slots x 256
    o.n_parallel = 2;
    o.n_batch = o.n_ubatch = 48;
    o.n_outputs_max = n_out;
    o.n_top = n_top;
    o.n_threads = 2;
    o.type_k = GgmlType::Q8_0;
    o.type_v = GgmlType::F16;
    auto p = plan_memory(*shape, nullptr, o, 0, std::nullopt);
    ASSERT_TRUE(p.ok()) << p.error().message;
    const auto use = cx.memory_use();
    ASSERT_EQ(use.size(), 1u);  // the host only
    const PlanPart* kv = part(*p, "KV cache");
    const PlanPart* rec = part(*p, "recurrent state");
    EXPECT_EQ((kv ? kv->host : 0) + (rec ? rec->host : 0), (*mem)->allocated_bytes());
    EXPECT_EQ(part(*p, "compute scratch")->host, use[0].arena);
    EXPECT_EQ(part(*p, "logits")->host, use[0].logits);
    EXPECT_EQ(part(*p, "op workspaces")->host, (use[0].workspace + 63) / 64 * 64);
    EXPECT_EQ(part(*p, "weights")->host, (*m)->info().weight_bytes);
    EXPECT_EQ(p->gpu_total(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelFitCpu, ::testing::Values("llama", "qwen3", "qwen35", "qwen35moe"));

// The metadata-only files of this process go when it ends.
struct RemoveTmp : ::testing::Environment {
  void TearDown() override { fs::remove_all(tmp_dir()); }
};
const auto* const kRemoveTmp = ::testing::AddGlobalTestEnvironment(new RemoveTmp);

}  // namespace
}  // namespace kiln::model
