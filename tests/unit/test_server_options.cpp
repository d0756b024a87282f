// `kiln serve`'s option table (server/options.h) for the MoE expert-offload flags: --cpu-moe (-cmoe),
// --n-cpu-moe (-ncmoe), -ot/--override-tensor, their llama-server variables (LLAMA_ARG_CPU_MOE,
// LLAMA_ARG_N_CPU_MOE, LLAMA_ARG_OVERRIDE_TENSOR) and errors that name the flag and the value. The
// values go through model::placement_options, the parser the tools use too.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/placement.h"
#include "server/options.h"

namespace kiln::server {
namespace {

Result<ServerOptions> parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  std::vector<const char*> argv{"kiln-serve"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_server_args(int(argv.size()), argv.data(), [env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ServerOptions, MoeOffloadFlags) {
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->engine.placement.given());
  for (const char* f : {"--cpu-moe", "-cmoe"}) {
    auto r = parse({f});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->engine.placement.n_cpu_moe, model::kCpuMoeAll) << f;
  }
  for (const char* f : {"--n-cpu-moe", "-ncmoe"}) {
    auto r = parse({f, "12"});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->engine.placement.n_cpu_moe, 12) << f;
  }
  auto b = parse({"--cpu-moe=false", "--n-cpu-moe", "3"});
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->engine.placement.n_cpu_moe, 3);
  // -ot repeats and takes comma lists; the order is kept.
  auto ot = parse({"-ot", "blk\\.(0|1)\\.ffn_.*_exps=CPU", "--override-tensor", "blk\\.2\\.=CUDA0,exps=CPU"});
  ASSERT_TRUE(ot.ok()) << ot.error().message;
  const auto& o = ot->engine.placement.overrides;
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].spec(), "blk\\.(0|1)\\.ffn_.*_exps=CPU");
  EXPECT_EQ(o[1].spec(), "blk\\.2\\.=CUDA0");
  EXPECT_EQ(o[2].spec(), "exps=CPU");
  auto eq = parse({"--override-tensor=exps=CPU"});
  ASSERT_TRUE(eq.ok()) << eq.error().message;
  ASSERT_EQ(eq->engine.placement.overrides.size(), 1u);
  EXPECT_EQ(eq->engine.placement.overrides[0].pattern, "exps");
}

TEST(ServerOptions, MoeOffloadEnvironment) {
  auto r = parse({}, {{"LLAMA_ARG_CPU_MOE", "1"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->engine.placement.n_cpu_moe, model::kCpuMoeAll);
  r = parse({}, {{"LLAMA_ARG_N_CPU_MOE", "5"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->engine.placement.n_cpu_moe, 5);
  r = parse({"--n-cpu-moe", "7"}, {{"LLAMA_ARG_N_CPU_MOE", "5"}});  // the command line wins
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->engine.placement.n_cpu_moe, 7);
  r = parse({}, {{"LLAMA_ARG_OVERRIDE_TENSOR", "exps=CPU"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->engine.placement.overrides.size(), 1u);
  // -ot on the command line replaces the variable's rules (not added to them).
  r = parse({"-ot", "blk\\.0\\.=CUDA0"}, {{"LLAMA_ARG_OVERRIDE_TENSOR", "exps=CPU"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->engine.placement.overrides.size(), 1u);
  EXPECT_EQ(r->engine.placement.overrides[0].device, "CUDA0");
  EXPECT_NE(server_help_text().find("LLAMA_ARG_OVERRIDE_TENSOR"), std::string::npos);
  EXPECT_NE(server_help_text().find("-cmoe, --cpu-moe"), std::string::npos);
}

TEST(ServerOptions, MoeOffloadErrors) {
  struct Bad {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::vector<const char*> says;
  };
  const Bad cases[] = {
      {{"-ot", "blk[=CPU"}, {}, {"option -ot", "blk[=CPU", "bad regular expression"}},
      {{"-ot", "exps=GPU0"}, {}, {"option -ot", "unknown device 'GPU0'"}},
      {{"--override-tensor", "exps"}, {}, {"--override-tensor", "PATTERN=DEVICE"}},
      {{"-ot"}, {}, {"-ot", "needs a value"}},
      {{"--n-cpu-moe", "-1"}, {}, {"--n-cpu-moe", "-1"}},
      {{"-ncmoe", "lots"}, {}, {"-ncmoe", "lots"}},
      {{}, {{"LLAMA_ARG_N_CPU_MOE", "x"}}, {"LLAMA_ARG_N_CPU_MOE", "'x'"}},
      {{}, {{"LLAMA_ARG_CPU_MOE", "maybe"}}, {"LLAMA_ARG_CPU_MOE", "maybe"}},
      {{}, {{"LLAMA_ARG_OVERRIDE_TENSOR", "exps=Vulkan0"}}, {"LLAMA_ARG_OVERRIDE_TENSOR", "Vulkan0"}},
  };
  for (const Bad& b : cases) {
    auto r = parse(b.args, b.env);
    ASSERT_FALSE(r.ok()) << (b.args.empty() ? "env" : b.args[0]);
    for (const char* w : b.says) EXPECT_NE(r.error().message.find(w), std::string::npos) << w << " in: " << r.error().message;
  }
}

}  // namespace
}  // namespace kiln::server

namespace kiln::server {
namespace {

// --warmup (llama-server's, on by default), --no-warmup, LLAMA_ARG_WARMUP; --cache-states.
TEST(ServerOptions, WarmupAndCacheStates) {
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->engine.warmup);
  EXPECT_EQ(d->engine.cache_states, -1);
  auto off = parse({"--no-warmup", "--cache-states", "12"});
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_FALSE(off->engine.warmup);
  EXPECT_EQ(off->engine.cache_states, 12);
  auto env = parse({}, {{"LLAMA_ARG_WARMUP", "0"}});
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(env->engine.warmup);
  auto on = parse({"--warmup"}, {{"LLAMA_ARG_WARMUP", "0"}});
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->engine.warmup);
  EXPECT_FALSE(parse({"--cache-states", "-2"}).ok());
}

// --batch-invariant (off by default), KILN_BATCH_INVARIANT.
TEST(ServerOptions, BatchInvariant) {
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->engine.batch_invariant);
  auto on = parse({"--batch-invariant"});
  ASSERT_TRUE(on.ok()) << on.error().message;
  EXPECT_TRUE(on->engine.batch_invariant);
  auto env = parse({}, {{"KILN_BATCH_INVARIANT", "1"}});
  ASSERT_TRUE(env.ok());
  EXPECT_TRUE(env->engine.batch_invariant);
  EXPECT_FALSE(parse({"--batch-invariant=maybe"}).ok());
}

// --delta-chunk N|auto, KILN_DELTA_CHUNK; auto resolves to 64 on a GPU without --batch-invariant, else 0.
// -ub N|auto, LLAMA_ARG_UBATCH: auto (0, the default) is resolved by the memory plan (model::fit_plan).
TEST(ServerOptions, UbatchAuto) {
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->engine.n_ubatch, 0);
  auto n = parse({"-ub", "1024"});
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->engine.n_ubatch, 1024);
  auto e = parse({}, {{"LLAMA_ARG_UBATCH", "256"}});
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->engine.n_ubatch, 256);
  auto a = parse({"--ubatch-size", "auto"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->engine.n_ubatch, 0);
  for (const char* v : {"0", "-1", "lots"}) {
    auto bad = parse({"-ub", v});
    ASSERT_FALSE(bad.ok()) << v;
    EXPECT_NE(bad.error().message.find("-ub"), std::string::npos) << bad.error().message;
  }
}

TEST(ServerOptions, DeltaChunk) {
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->engine.delta_chunk_min, -1);
  EXPECT_EQ(engine::resolve_delta_chunk(d->engine, true), 64);
  EXPECT_EQ(engine::resolve_delta_chunk(d->engine, false), 0);
  auto inv = parse({"--batch-invariant"});
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(engine::resolve_delta_chunk(inv->engine, true), 0);
  auto n = parse({"--delta-chunk", "128"});
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(engine::resolve_delta_chunk(n->engine, false), 128);
  auto z = parse({}, {{"KILN_DELTA_CHUNK", "0"}});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(engine::resolve_delta_chunk(z->engine, true), 0);
  auto a = parse({"--delta-chunk", "auto"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->engine.delta_chunk_min, -1);
  auto bad = parse({"--delta-chunk", "many"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--delta-chunk"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(parse({"--delta-chunk", "-3"}).ok());
}

}  // namespace
}  // namespace kiln::server
