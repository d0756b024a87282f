// MoE expert offload without a GPU (model/placement.h, docs/memory.md "Expert offload"):
//  - the flags' one parser (-ot values, --cpu-moe, --n-cpu-moe) and its errors;
//  - the placement decision: which blocks keep their expert tensors on the host for a given file,
//    -ngl and flags (tiny-qwen35moe, with and without its MTP block), and every refusal;
//  - the memory plan with offloaded experts, by hand from the tensor table (tiny and the
//    Qwen3.5-35B-A3B shape, metadata only), and fitting: experts go to the host before layers when
//    nothing about them was given; explicit flags are kept;
//  - a CPU run is unchanged by the flags (nothing runs on a GPU, so nothing moves).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "model/context.h"
#include "model/fit.h"
#include "model/gen/gen.h"
#include "model/memory.h"
#include "model/model.h"
#include "model/placement.h"
#include "model_test_util.h"

namespace kiln::model {
namespace {

namespace fs = std::filesystem;
using gguf::GgmlType;
constexpr uint64_t kGiB = uint64_t(1) << 30;

fs::path tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("kiln_test_model_placement_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

using Meta = test::MetaModel;
Meta meta_model(const std::string& preset, gen::Mix mix, GgmlType type = GgmlType::Q8_0) {
  gen::GenOptions o;
  o.spec = gen::find_preset(preset)->spec;
  o.mix = mix;
  o.type = type;
  return test::meta_model(tmp_dir() / (preset + ".meta.gguf"), o);
}

DeviceBudget card(uint64_t bytes) {
  DeviceBudget b;
  b.name = "CUDA0 (simulated)";
  b.free = b.cap = bytes;
  return b;
}

const PlanPart* part(const MemoryPlan& p, const std::string& name) {
  for (const auto& x : p.parts)
    if (x.name == name) return &x;
  return nullptr;
}

PlacementOptions opts(bool cpu_moe, int n, std::vector<std::string> ot = {}) {
  auto p = placement_options(cpu_moe, n, ot);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? *p : PlacementOptions{};
}

// ---- the parser ----

TEST(ModelPlacement, ParsesTheFlags) {
  auto r = parse_tensor_overrides("blk\\.(0|1)\\.ffn_.*_exps=CPU,exps=CUDA0");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].pattern, "blk\\.(0|1)\\.ffn_.*_exps");
  EXPECT_TRUE((*r)[0].cpu());
  EXPECT_EQ((*r)[1].device, "CUDA0");
  // Repeated -ot values keep their order; --cpu-moe wins over --n-cpu-moe (every block).
  auto p = placement_options(true, 3, {"a=CPU", "b=CUDA0,c=CPU"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_cpu_moe, kCpuMoeAll);
  ASSERT_EQ(p->overrides.size(), 3u);
  EXPECT_EQ(p->overrides[2].spec(), "c=CPU");
  EXPECT_TRUE(p->given());
  EXPECT_FALSE(placement_options(false, 0, {})->given());
  EXPECT_EQ(placement_options(false, 7, {})->n_cpu_moe, 7);
}

TEST(ModelPlacement, FlagErrorsNameTheFlagAndValue) {
  struct Bad {
    const char* value;
    const char* says;
  };
  for (Bad b : {Bad{"exps", "expected PATTERN=DEVICE"}, Bad{"=CPU", "empty pattern"},
                Bad{"blk[=CPU", "bad regular expression 'blk['"}, Bad{"exps=GPU0", "unknown device 'GPU0'"},
                Bad{"exps=cuda0", "unknown device 'cuda0'"}, Bad{"exps=CUDA", "unknown device 'CUDA'"},
                Bad{"a=CPU,b=Metal", "unknown device 'Metal'"}}) {
    auto r = parse_tensor_overrides(b.value);
    ASSERT_FALSE(r.ok()) << b.value;
    EXPECT_NE(r.error().message.find("-ot/--override-tensor"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(b.value), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(b.says), std::string::npos) << r.error().message;
  }
  auto n = placement_options(false, -1, {});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("--n-cpu-moe -1"), std::string::npos);
  EXPECT_TRUE(is_expert_tensor("blk.12.ffn_down_exps.weight"));
  EXPECT_FALSE(is_expert_tensor("blk.12.ffn_down_shexp.weight"));
  EXPECT_FALSE(is_expert_tensor("blk.12.ffn_gate_inp.weight"));
  int64_t il = -1;
  EXPECT_TRUE(is_expert_tensor("blk.7.ffn_up_exps.weight", &il));
  EXPECT_EQ(il, 7);
}

// ---- the decision ----

BlockDevices devices(const ModelConfig& c, int ngl, bool mtp = false) { return BlockDevices::of(c, ngl, mtp); }

std::vector<uint8_t> host_blocks(const Meta& m, int ngl, const PlacementOptions& o, bool mtp = false) {
  auto p = place_experts(*m.file, m.shape.cfg, devices(m.shape.cfg, ngl, mtp), o);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? p->host : std::vector<uint8_t>{};
}

std::string place_error(const Meta& m, int ngl, const PlacementOptions& o) {
  auto p = place_experts(*m.file, m.shape.cfg, devices(m.shape.cfg, ngl), o);
  return p.ok() ? std::string("(no error)") : p.error().message;
}

TEST(ModelPlacement, WhichBlocksKeepTheirExpertsOnTheHost) {
  Meta m = meta_model("tiny-qwen35moe", gen::Mix::Uniform);
  ASSERT_EQ(m.shape.cfg.n_layer, 4);
  using V = std::vector<uint8_t>;
  EXPECT_EQ(host_blocks(m, 5, {}), V({0, 0, 0, 0}));                        // nothing asked
  EXPECT_EQ(host_blocks(m, 5, opts(true, 0)), V({1, 1, 1, 1}));             // --cpu-moe
  EXPECT_EQ(host_blocks(m, 5, opts(false, 1)), V({1, 0, 0, 0}));            // --n-cpu-moe 1
  EXPECT_EQ(host_blocks(m, 5, opts(false, 99)), V({1, 1, 1, 1}));           // more than there are
  // -ngl 2: blocks 0 and 1 run on the CPU (their experts with them); --n-cpu-moe 3 adds block 2.
  EXPECT_EQ(host_blocks(m, 2, opts(false, 3)), V({0, 0, 1, 0}));
  EXPECT_EQ(host_blocks(m, 0, opts(true, 0)), V({0, 0, 0, 0}));             // all on the CPU: nothing to move
  // -ot, llama.cpp's usual spellings.
  EXPECT_EQ(host_blocks(m, 5, opts(false, 0, {"exps=CPU"})), V({1, 1, 1, 1}));
  EXPECT_EQ(host_blocks(m, 5, opts(false, 0, {"\\.ffn_(up|down|gate)_exps=CPU"})), V({1, 1, 1, 1}));
  EXPECT_EQ(host_blocks(m, 5, opts(false, 0, {"blk\\.(1|3)\\.ffn_.*_exps\\.=CPU"})), V({0, 1, 0, 1}));
  // The first matching rule decides, and -ot comes before --cpu-moe: block 2 stays on the GPU.
  EXPECT_EQ(host_blocks(m, 5, opts(true, 0, {"blk\\.2\\.=CUDA0"})), V({1, 1, 0, 1}));
  EXPECT_EQ(host_blocks(m, 5, opts(false, 0, {"blk\\.2\\.ffn=CUDA0", "exps=CPU"})), V({1, 1, 0, 1}));
  // A rule naming the GPU for tensors already there, or the CPU for CPU layers: nothing moves.
  EXPECT_EQ(host_blocks(m, 5, opts(false, 0, {"attn=CUDA0"})), V({0, 0, 0, 0}));
  EXPECT_EQ(host_blocks(m, 2, opts(false, 0, {"blk\\.0\\.=CPU", "token_embd=CPU"})), V({0, 0, 0, 0}));
  // The MTP block (blk.4) runs with the last trunk layer: --cpu-moe takes its experts too, --n-cpu-moe 4
  // does not; with the output on the host (-ngl 4, 1) it is still on the GPU.
  Meta mtp = meta_model("tiny-qwen35moe-mtp", gen::Mix::Uniform);
  EXPECT_EQ(host_blocks(mtp, 5, opts(true, 0), /*mtp=*/true), V({1, 1, 1, 1, 1}));
  EXPECT_EQ(host_blocks(mtp, 5, opts(false, 4), true), V({1, 1, 1, 1, 0}));
  EXPECT_EQ(host_blocks(mtp, 5, opts(true, 0), /*mtp not run*/ false), V({1, 1, 1, 1, 0}));
  EXPECT_EQ(host_blocks(mtp, 4, opts(true, 0), true), V({1, 1, 1, 1, 1}));
  EXPECT_EQ(host_blocks(mtp, 1, opts(true, 0), true), V({0, 0, 0, 1, 1}));
  EXPECT_EQ(host_blocks(mtp, 0, opts(true, 0), true), V({0, 0, 0, 0, 0}));
}

TEST(ModelPlacement, RefusalsNameTheRuleAndTheTensor) {
  Meta m = meta_model("tiny-qwen35moe", gen::Mix::Uniform);
  auto has = [](const std::string& msg, std::initializer_list<const char*> words) {
    for (const char* w : words) EXPECT_NE(msg.find(w), std::string::npos) << w << " in: " << msg;
  };
  has(place_error(m, 5, opts(false, 0, {"nothing_like_this=CPU"})),
      {"-ot/--override-tensor", "nothing_like_this=CPU", "matches no tensor"});
  // Checked for matching even when everything runs on the CPU.
  has(place_error(m, 0, opts(false, 0, {"nothing_like_this=CPU"})), {"matches no tensor"});
  has(place_error(m, 5, opts(false, 0, {"ffn_gate_inp=CPU"})),
      {"'ffn_gate_inp=CPU'", "blk.0.ffn_gate_inp", "block 0 runs on CUDA0", "expert tensors"});
  has(place_error(m, 5, opts(false, 0, {"output=CPU"})), {"output", "the CPU"});
  has(place_error(m, 5, opts(false, 0, {"blk\\.0\\.ffn_gate_exps=CPU"})), {"block 0", "together"});
  has(place_error(m, 5, opts(false, 0, {"exps=CUDA1"})), {"CUDA1", "CUDA0"});
  has(place_error(m, 2, opts(false, 0, {"blk\\.0\\.ffn_.*_exps=CUDA0"})), {"blk.0.ffn_", "block 0 runs on the CPU"});
  Meta dense = meta_model("tiny-qwen35", gen::Mix::Uniform);
  has(place_error(dense, 5, opts(true, 0)), {"--cpu-moe", "no expert tensors"});
  has(place_error(dense, 5, opts(false, 2)), {"--n-cpu-moe 2", "no expert tensors"});
}

// ---- the plan ----

// Sums by hand from the tensor table: the expert tensors' file bytes of blocks [b0, b1), and the packed
// (256-byte) sizes of the other tensors of each block, as the loader uploads them.
struct Sums {
  uint64_t experts = 0, rest_packed = 0;
};
Sums block_sums(const gguf::File& f, int64_t b0, int64_t b1) {
  Sums s;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const int64_t il = std::stoll(t.name.substr(4, t.name.find('.', 4) - 4));
    if (il < b0 || il >= b1) continue;
    if (is_expert_tensor(t.name)) s.experts += t.n_bytes;
    else s.rest_packed += (bound_weight_bytes(t) + 255) / 256 * 256;
  }
  return s;
}

TEST(ModelPlacement, PlanCountsOffloadedExpertsOnTheHost) {
  Meta m = meta_model("qwen35moe-35b-a3b", gen::Mix::Q4_K_M);
  const ModelConfig& c = m.shape.cfg;
  ASSERT_EQ(c.n_layer, 40);
  ASSERT_EQ(c.n_expert, 256);
  PlanOptions o;
  o.n_ctx = 32768;
  o.n_outputs_max = 1;
  auto all = plan_memory(m.shape, nullptr, o, 41, card(80 * kGiB));
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(part(*all, "expert weights"), nullptr);
  EXPECT_EQ(all->n_expert_host, 0);
  const Sums every = block_sums(*m.file, 0, 40), first10 = block_sums(*m.file, 0, 10);
  for (auto [n, want] : {std::pair{kCpuMoeAll, every.experts}, std::pair{10, first10.experts}}) {
    o.placement = opts(n == kCpuMoeAll, n == kCpuMoeAll ? 0 : n);
    auto p = plan_memory(m.shape, nullptr, o, 41, card(80 * kGiB));
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_EQ(p->n_expert_host, n == kCpuMoeAll ? 40 : 10);
    ASSERT_NE(part(*p, "expert weights"), nullptr);
    EXPECT_EQ(part(*p, "expert weights")->host, want);
    EXPECT_EQ(part(*p, "expert weights")->gpu, 0u);
    // The GPU loses exactly those blocks' expert uploads (each block one packed buffer without them).
    const Sums moved = n == kCpuMoeAll ? every : first10;
    uint64_t packed_with = 0;
    for (const auto& t : m.file->tensors()) {
      int64_t il = -1;
      if (is_expert_tensor(t.name, &il) && il < (n == kCpuMoeAll ? 40 : 10)) packed_with += (t.n_bytes + 255) / 256 * 256;
    }
    EXPECT_EQ(part(*all, "weights")->gpu - part(*p, "weights")->gpu, packed_with);
    EXPECT_EQ(part(*p, "weights")->host, part(*all, "weights")->host);  // token_embd only
    (void)moved;
    // The host now runs those experts: their hidden slots and outputs are host scratch too.
    EXPECT_GT(part(*p, "compute scratch")->host, part(*all, "compute scratch")->host);
    EXPECT_GT(part(*p, "op workspaces")->host, 0u);
  }
  // The experts are the bulk of a 35B-A3B: everything else is under 2.5 GiB.
  EXPECT_GT(every.experts, 15 * kGiB);
  EXPECT_LT(every.rest_packed, 5 * kGiB / 2);
  // The table says where they went.
  o.placement = opts(true, 0);
  auto p = plan_memory(m.shape, nullptr, o, 41, card(80 * kGiB));
  ASSERT_TRUE(p.ok());
  EXPECT_NE(p->table().find("the expert tensors of 40 of them on the host"), std::string::npos) << p->table();
  EXPECT_NE(p->table().find("(--cpu-moe)"), std::string::npos) << p->table();
}

TEST(ModelPlacement, FitMovesExpertsBeforeLayers) {
  Meta m = meta_model("qwen35moe-35b-a3b", gen::Mix::Q4_K_M);
  PlanOptions o;
  o.n_ctx = 32768;
  o.n_outputs_max = 1;
  const DeviceBudget gpu = card(8 * kGiB);
  // -ngl auto, no expert flags: every layer stays on the GPU, the first N layers' experts go to the host.
  auto p = fit_plan(m.shape, nullptr, o, FitOptions{}, gpu);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->fits());
  EXPECT_EQ(p->n_gpu_layers, 41);
  EXPECT_EQ(p->n_ctx, 32768);
  ASSERT_GT(p->n_cpu_moe, 0);
  ASSERT_LT(p->n_cpu_moe, 40);
  EXPECT_EQ(p->n_expert_host, p->n_cpu_moe);
  // The smallest such N: one layer fewer does not fit.
  PlanOptions less = o;
  less.placement.n_cpu_moe = p->n_cpu_moe - 1;
  auto q = plan_memory(m.shape, nullptr, less, 41, gpu);
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->fits());
  // -c left unset: lowered to --fit-ctx first, then experts, then the context grows back with them.
  o.n_ctx = 0;
  auto u = fit_plan(m.shape, nullptr, o, FitOptions{}, gpu);
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_TRUE(u->fits());
  EXPECT_EQ(u->n_gpu_layers, 41);
  EXPECT_GT(u->n_cpu_moe, 0);
  EXPECT_GE(u->n_ctx, 4096);
  EXPECT_EQ(u->n_ctx % 256, 0);
  PlanOptions more = o;
  more.placement.n_cpu_moe = u->n_cpu_moe;
  more.n_ctx = u->n_ctx + 256;
  if (u->n_ctx < 262144) {
    auto r = plan_memory(m.shape, nullptr, more, 41, gpu);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->fits());
  }
  // Explicit expert flags are kept: --n-cpu-moe 2 cannot fit every layer, so layers move instead.
  o.n_ctx = 32768;
  o.placement = opts(false, 2);
  auto e = fit_plan(m.shape, nullptr, o, FitOptions{}, gpu);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->n_cpu_moe, 2);
  EXPECT_LT(e->n_gpu_layers, 41);
  // Explicit -ngl all without expert flags: experts are not moved either; the error says what would help.
  o.placement = {};
  o.n_gpu_layers = kGpuLayersAll;
  auto bad = fit_plan(m.shape, nullptr, o, FitOptions{}, gpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--cpu-moe"), std::string::npos) << bad.error().message;
  // -ngl all --cpu-moe on 8 GiB fits, as llama-server users run the 35B-A3B.
  o.placement = opts(true, 0);
  auto cm = fit_plan(m.shape, nullptr, o, FitOptions{}, gpu);
  ASSERT_TRUE(cm.ok()) << cm.error().message;
  EXPECT_TRUE(cm->fits());
  EXPECT_EQ(cm->n_expert_host, 40);
  // A dense model is fitted as before (no expert step).
  Meta dense = meta_model("qwen35-9b", gen::Mix::IQ4_XS);
  PlanOptions d;
  d.n_ctx = 65536;
  d.n_outputs_max = 1;
  auto dp = fit_plan(dense.shape, nullptr, d, FitOptions{}, gpu);
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->n_cpu_moe, 0);
  EXPECT_EQ(part(*dp, "expert weights"), nullptr);
}

// ---- CPU runs ----

// On the CPU the flags move nothing: the same placement and bit-identical logits.
TEST(ModelPlacement, CpuRunIsUnchanged) {
  const std::string path = test::generated_model("kiln_test_model_placement", "tiny-qwen35moe", GgmlType::Q8_0, 5);
  auto logits = [&](const PlacementOptions& po) {
    LoadOptions lo;
    lo.n_gpu_layers = 0;
    lo.placement = po;
    auto m = load_model(path, lo);
    EXPECT_TRUE(m.ok()) << m.error().message;
    std::vector<float> out;
    if (!m.ok()) return out;
    for (int64_t il = 0; il < (*m)->config().n_layer; ++il)
      EXPECT_EQ(&(*m)->expert_device(il), &(*m)->host_device()) << il;
    EXPECT_EQ((*m)->info().n_expert_host, 0);
    MemoryOptions mo;
    mo.n_ctx = 64;
    auto mem = Memory::create(**m, mo);
    EXPECT_TRUE(mem.ok());
    ContextOptions co;
    co.n_batch = 16;
    co.n_threads = 2;
    Context cx(**m, co);
    Batch b;
    b.add_run(test::random_tokens(9, (*m)->config().n_vocab, 3), 0, 0, true);
    EXPECT_TRUE(cx.decode(b, **mem).ok());
    for (int64_t i = 0; i < cx.n_outputs(); ++i)
      out.insert(out.end(), cx.logits(i), cx.logits(i) + (*m)->config().n_vocab);
    return out;
  };
  const auto plain = logits({});
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(logits(opts(true, 0)), plain);
  EXPECT_EQ(logits(opts(false, 2, {"blk\\.3\\.ffn_.*_exps=CPU"})), plain);
  // A bad rule is still refused at load.
  LoadOptions lo;
  lo.placement = opts(false, 0, {"nothing_like_this=CPU"});
  auto m = load_model(path, lo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("matches no tensor"), std::string::npos);
}

struct RemoveTmp : ::testing::Environment {
  void TearDown() override { fs::remove_all(tmp_dir()); }
};
const auto* const kRemoveTmp = ::testing::AddGlobalTestEnvironment(new RemoveTmp);

}  // namespace
}  // namespace kiln::model
