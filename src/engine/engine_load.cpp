// engine/engine_load.cpp — Engine's public side: construction and shutdown, loading a model (the
//   memory plan and fitting, the runner, the tokenizer) on the engine thread, serving set-up,
//   submit, slot actions (queued to the engine thread), metrics and slot info. The scheduling is
//   engine.cpp's; Impl is declared in engine_impl.h.
#include <algorithm>
#include <chrono>
#include <future>

#include "core/log.h"
#include "engine/engine_impl.h"
#include "model/fit.h"
#include "model/vocab_loader.h"

namespace kiln::engine {

// ============================================================================================
// Engine

Engine::Engine() : impl_(std::make_unique<Impl>(*this)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    impl_->inbox->stop = true;
  }
  impl_->inbox->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // Requests submitted after the thread ended (or when it never served).
  std::deque<Inbox::Pending> rest;
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    rest.swap(impl_->inbox->pending);
  }
  for (auto& p : rest) {
    Event e;
    e.finish = FinishReason::Cancelled;
    p.ch->push(std::move(e));
  }
}

static ModelInfo info_from_model(const model::Model& m, const tokenizer::Tokenizer& tok, const std::string& path) {
  ModelInfo mi;
  const auto& c = m.config();
  mi.arch = c.arch_str;
  mi.name = c.name;
  mi.path = path;
  if (auto t = m.file().get_string("tokenizer.chat_template"); t.ok()) mi.chat_template = *t;
  mi.n_ctx_train = c.n_ctx_train;
  mi.pooling_type = c.pooling_type;
  mi.n_layer = c.n_layer;
  mi.n_vocab = c.n_vocab;
  mi.n_embd = c.n_embd;
  mi.n_params_bytes = int64_t(m.info().weight_bytes);
  mi.hybrid = model::arch_is_hybrid(c.arch);
  const auto& v = tok.vocab();
  mi.bos = v.bos;
  mi.eos = v.eos;
  mi.eot = v.eot;
  mi.add_bos = v.add_bos;
  mi.eog_ids = tok.eog_ids();
  if (v.bos >= 0 && v.bos < int32_t(v.tokens.size())) mi.bos_text = tok.token_to_piece(v.bos, true);
  if (v.eos >= 0 && v.eos < int32_t(v.tokens.size())) mi.eos_text = tok.token_to_piece(v.eos, true);
  return mi;
}

int resolve_delta_chunk(const EngineOptions& o, bool gpu) {
  if (o.delta_chunk_min >= 0) return o.delta_chunk_min;
  return gpu && !o.batch_invariant ? 64 : 0;
}

int resolve_cache_states(const EngineOptions& o) {
  if (o.cache_ram_bytes == 0) return 0;
  return o.cache_states >= 0 ? o.cache_states : std::min(64, std::max(1, o.n_parallel) + 4);
}

// The ModelRunner for the options: per-slot context and step size from the options (and the
// model's training context), the rest passed through.
static Result<std::unique_ptr<ModelRunner>> make_runner(const model::Model& m, const EngineOptions& o) {
  // The rules the memory planner counts with (model/fit.h).
  const int np = std::max(1, o.n_parallel);
  const int64_t total = model::resolve_total_context(o.n_ctx, m.config().n_ctx_train);
  ModelRunnerOptions ro;
  ro.n_ctx_slot = model::slot_context(total, np);
  ro.n_batch = model::step_tokens(o.n_batch, o.n_ubatch, np);
  ro.n_slots = np;
  ro.n_threads = o.n_threads;
  ro.type_k = o.type_k;
  ro.type_v = o.type_v;
  ro.delta_chunk_min = resolve_delta_chunk(o, m.info().n_gpu_layers > 0);
  ro.flash_attn = o.flash_attn;
  ro.batch_invariant = o.batch_invariant;
  ro.embeddings = o.embeddings;
  ro.n_spec = o.spec.n_keep();
  ro.mtp = o.spec.type == SpecType::DraftMtp;
  ro.mtp_draft_vocab = o.spec.draft_vocab;
  ro.n_top = runner_top_logits(o.embeddings);
  ro.n_state_slots = resolve_cache_states(o);
  return ModelRunner::create(m, ro);
}

Status Engine::init_serving(std::unique_ptr<Runner> runner) {
  Impl& I = *impl_;
  I.runner = std::move(runner);
  I.tok = tok_.get();
  I.n_ctx_slot = I.runner->n_ctx();
  I.step_tokens = I.runner->n_batch();
  I.recurrent = I.runner->has_recurrent();
  if (I.runner->n_vocab() < int64_t(tok_->n_tokens()))
    return err("model has {} logits but the vocabulary has {} tokens", I.runner->n_vocab(), tok_->n_tokens());
  I.eog = tok_->eog_ids();
  for (int32_t t : info_.eog_ids) I.eog.push_back(t);
  std::sort(I.eog.begin(), I.eog.end());
  I.eog.erase(std::unique(I.eog.begin(), I.eog.end()), I.eog.end());
  info_.eog_ids = I.eog;
  info_.n_ctx_slot = I.n_ctx_slot;
  info_.n_ctx = I.n_ctx_slot * I.runner->n_slots();
  info_.n_vocab = I.runner->n_vocab();
  info_.hybrid = I.recurrent;
  PrefixCacheOptions po;
  po.block = std::max<int32_t>(1, opt_.cache_block);
  po.ram_bytes = opt_.cache_ram_bytes;
  po.recurrent = I.recurrent;
  po.kv_bytes_per_pos = I.runner->kv_bytes_per_pos();
  po.rec_floats = I.runner->rec_floats();
  po.n_dev_states = I.recurrent ? I.runner->n_state_slots() : 0;
  po.read_dev = [r = I.runner.get()](int i, float* out) { r->read_state_slot(i, out); };
  I.cache = std::make_unique<PrefixCache>(po);
  I.grammars = std::make_unique<GrammarCache>(tok_.get(), I.eog, I.runner->n_vocab());
  const int64_t B = po.block;
  I.snap_interval = std::max<int64_t>(B, (std::max<int64_t>(opt_.cache_snapshot_interval, 1) + B - 1) / B * B);
  const SpecOptions& so = opt_.spec;
  if (so.on()) {
    if (so.type == SpecType::DraftSimple && !I.drafter)
      return err("--spec-type draft-simple needs a draft model (-md/--model-draft FILE)");
    if (so.type == SpecType::DraftMtp && !I.runner->has_mtp())
      return err("--spec-type draft-mtp: the model has no MTP block (blk.<n_layer>.nextn.*, qwen35/qwen35moe) or the "
                 "runner does not run it");
    if (so.n_max < 1 || so.n_max > 16) return err("--spec-draft-n-max {}: must be within [1, 16]", so.n_max);
    if (so.n_min < 0 || so.n_min > so.n_max)
      return err("--spec-draft-n-min {}: must be within [0, --spec-draft-n-max {}]", so.n_min, so.n_max);
    if (so.p_min < 0 || so.p_min > 1) return err("--spec-draft-p-min {}: must be within [0, 1]", so.p_min);
    if (so.ngram_n < 1) return err("--spec-ngram-size-n {}: must be at least 1", so.ngram_n);
    if (so.draft_vocab < 0) return err("--spec-draft-vocab {}: must be 0 (the whole vocabulary) or positive", so.draft_vocab);
  } else if (so.synthetic()) {
    return err("--spec-synth-len/--spec-synth-rates: synthetic acceptance requires --spec-type");
  }
  auto probs = synth_probs(so);
  KILN_TRY(probs);
  I.synth = std::move(*probs);
  if (!I.synth.empty()) {
    std::string r;
    for (double p : I.synth) r += fmt::format("{}{:.4f}", r.empty() ? "" : ", ", p);
    KILN_LOG_WARN("--spec-synth-*: synthetic acceptance for benchmarking: draft tokens are accepted at random, the "
                  "generated output is not valid (conditional rates [{}])", r);
  }
  if (so.on())
    KILN_LOG_INFO("speculative decoding: {}, up to {} draft tokens per step (n_min {}, p_min {})", spec_type_name(so.type),
                  so.n_max, so.n_min, so.p_min);
  I.slots.assign(size_t(I.runner->n_slots()), SlotState{});
  for (int s = 0; s < I.runner->n_slots(); ++s) I.runner->seq_clear(s);
  I.publish();
  return {};
}

// The projector (--mmproj): loaded after the model, on the GPU with --mmproj-offload when the model
// has layers there (llama-server's rule), its preprocessing published in ModelInfo.
Status Engine::load_vision() {
  if (opt_.mmproj.empty()) return {};
  if (!model::arch_is_hybrid(model_->config().arch))
    return err("--mmproj {}: images need a Qwen3.5 text model (qwen35 / qwen35moe), not {}", opt_.mmproj,
               model_->config().arch_str);
  model::VisionLoadOptions vo;
  vo.load_mode = opt_.load_mode;
  vo.offload = opt_.mmproj_offload && model_->info().n_gpu_layers > 0;
  vo.main_gpu = opt_.main_gpu;
  auto vm = model::VisionModel::load(opt_.mmproj, vo);
  KILN_TRY(vm);
  const auto& vc = (*vm)->config();
  if (vc.n_out != model_->config().n_embd)
    return err("--mmproj {}: the projector gives {} floats per image token, the model's n_embd is {}", opt_.mmproj,
               vc.n_out, model_->config().n_embd);
  if (!vc.deepstack.empty())
    return err("--mmproj {}: DeepStack layers (Qwen3-VL) are not supported with a {} text model", opt_.mmproj,
               model_->config().arch_str);
  impl_->vision = std::move(*vm);
  impl_->vision_pool = std::make_unique<ThreadPool>(opt_.n_threads);
  impl_->vision_enc = std::make_unique<model::VisionEncoder>(*impl_->vision, *impl_->vision_pool);
  info_.vision = true;
  info_.mmproj = opt_.mmproj;
  info_.vision_patch = int(vc.patch);
  info_.vision_merge = int(vc.merge);
  for (int i = 0; i < 3; ++i) info_.vision_mean[i] = vc.mean[i], info_.vision_std[i] = vc.std[i];
  return {};
}

// The draft model's KV cache types: -ctkd / -ctvd, else the target's.
static Result<std::pair<model::GgmlType, model::GgmlType>> draft_cache_types(const SpecOptions& so, model::GgmlType tk,
                                                                      model::GgmlType tv) {
  std::pair<model::GgmlType, model::GgmlType> r{tk, tv};
  for (auto [s, t] : {std::pair{&so.type_k_draft, &r.first}, std::pair{&so.type_v_draft, &r.second}})
    if (!s->empty()) {
      auto ty = gguf::type_from_name(*s);
      if (!ty || (*ty != model::GgmlType::F32 && *ty != model::GgmlType::F16 && *ty != model::GgmlType::Q8_0 &&
                  *ty != model::GgmlType::Q4_0))
        return err("-ctkd/-ctvd {}: the draft model's KV cache types are f32, f16, q8_0, q4_0", *s);
      *t = *ty;
    }
  return r;
}

// --spec-type draft-simple: the draft model (-md) with its own memory (the target runner's slots and
// context, -ctkd/-ctvd, -ngld), after checking that it shares the target's vocabulary.
Result<std::unique_ptr<DraftModel>> Engine::load_draft_model(const Runner& target) {
  const SpecOptions& so = opt_.spec;
  if (so.model_draft.empty()) return err("--spec-type draft-simple needs a draft model (-md/--model-draft FILE)");
  model::LoadOptions lo;
  lo.load_mode = opt_.load_mode;
  lo.n_gpu_layers = so.n_gpu_layers_draft < 0 ? model::kGpuLayersAuto : so.n_gpu_layers_draft;
  lo.main_gpu = opt_.main_gpu;
  auto m = model::load_model(so.model_draft, lo);
  if (!m.ok()) return err("--spec-type draft-simple: -md/--model-draft: {}", m.error().message);
  auto t = model::load_tokenizer((*m)->file());
  if (!t.ok()) return err("-md/--model-draft {}: {}", so.model_draft, t.error().message);
  // The same vocabulary (llama.cpp's rule: the same token texts; sizes within 128 of each other).
  const auto &tv = tok_->vocab().tokens, &dv = (*t)->vocab().tokens;
  if (tv.size() > dv.size() + 128 || dv.size() > tv.size() + 128)
    return err("-md/--model-draft {}: its vocabulary has {} tokens, the target's {}", so.model_draft, dv.size(), tv.size());
  for (size_t i = 0; i < std::min(tv.size(), dv.size()); ++i)
    if (tv[i] != dv[i]) return err("-md/--model-draft {}: token {} is '{}', the target's '{}': not the same vocabulary",
                                   so.model_draft, i, dv[i], tv[i]);
  DraftModelOptions o;
  o.n_slots = target.n_slots();
  o.n_ctx_slot = target.n_ctx();
  o.n_batch = target.n_batch();
  o.n_max = so.n_max;
  o.n_threads = opt_.n_threads;
  auto types = draft_cache_types(so, opt_.type_k, opt_.type_v);
  KILN_TRY(types);
  o.type_k = types->first;
  o.type_v = types->second;
  auto d = DraftModel::create(**m, o);
  KILN_TRY(d);
  KILN_LOG_INFO("draft model {}: {} layers, {} vocabulary", so.model_draft, (*m)->config().n_layer,
                (*m)->config().n_vocab);
  draft_model_ = std::move(*m);
  return std::move(*d);
}

Result<int> Engine::fit_memory(const gguf::File& f) {
  auto shape = model::ModelShape::from_file(f);
  KILN_TRY(shape);
  std::unique_ptr<gguf::File> proj_file;
  std::optional<model::ProjectorShape> proj;
  if (!opt_.mmproj.empty()) {
    gguf::OpenOptions po;
    po.limits.metadata_only = true;
    auto pf = gguf::File::open(opt_.mmproj, po);
    if (!pf.ok()) return err("--mmproj {}", pf.error().message);
    proj_file = std::move(*pf);
    auto ps = model::ProjectorShape::from_file(*proj_file);
    KILN_TRY(ps);
    proj = std::move(*ps);
  }
  model::PlanOptions o;
  o.n_ctx = opt_.n_ctx;
  o.n_parallel = std::max(1, opt_.n_parallel);
  o.n_batch = opt_.n_batch;
  o.n_ubatch = opt_.n_ubatch;
  o.n_outputs_max = runner_outputs_max(o.n_parallel, opt_.embeddings, opt_.spec.n_keep());
  o.n_top = runner_top_logits(opt_.embeddings);
  o.spec_mtp = opt_.spec.type == SpecType::DraftMtp;
  o.n_draft = opt_.spec.n_max;
  o.n_spec = opt_.spec.n_keep();
  o.n_rec_cache = resolve_cache_states(opt_);
  o.rec_cache_auto = opt_.cache_states < 0;
  o.type_k = opt_.type_k;
  o.type_v = opt_.type_v;
  o.n_threads = opt_.n_threads;
  o.delta_chunk_min = resolve_delta_chunk(opt_, opt_.n_gpu_layers != 0);
  o.flash_attn = opt_.flash_attn;
  o.n_gpu_layers = opt_.n_gpu_layers;
  o.main_gpu = opt_.main_gpu;
  o.placement = opt_.placement;
  o.cache_ram_bytes = opt_.cache_ram_bytes;
  o.image_max_tokens = opt_.image_max_tokens;
  // The draft model of draft-simple is planned beside the target (its metadata only).
  std::unique_ptr<gguf::File> draft_file;
  std::optional<model::ModelShape> draft;
  if (opt_.spec.type == SpecType::DraftSimple && !opt_.spec.model_draft.empty()) {
    gguf::OpenOptions dopt;
    dopt.limits.metadata_only = true;
    auto df = gguf::File::open(opt_.spec.model_draft, dopt);
    if (!df.ok()) return err("-md/--model-draft {}", df.error().message);
    draft_file = std::move(*df);
    auto ds = model::ModelShape::from_file(*draft_file);
    KILN_TRY(ds);
    draft = std::move(*ds);
    auto types = draft_cache_types(opt_.spec, opt_.type_k, opt_.type_v);
    KILN_TRY(types);
    o.draft = &*draft;
    o.draft_n_gpu_layers = opt_.spec.n_gpu_layers_draft < 0 ? model::kGpuLayersAuto : opt_.spec.n_gpu_layers_draft;
    o.draft_type_k = types->first;
    o.draft_type_v = types->second;
  }
  model::FitOptions fo;
  fo.fit = opt_.fit;
  fo.fit_ctx = opt_.fit_ctx;
  std::optional<model::DeviceBudget> gpu;
  if (opt_.n_gpu_layers != 0) gpu = model::gpu_budget(opt_.main_gpu, opt_.device_memory, opt_.fit_target, false);
  auto plan = model::fit_plan(*shape, proj ? &*proj : nullptr, o, fo, gpu);
  KILN_TRY(plan);
  KILN_LOG_INFO("{}", plan->table());
  if (!plan->fits()) KILN_LOG_WARN("--fit off: the plan does not fit {}; loading as asked", plan->gpu->name);
  if (opt_.cache_states < 0) opt_.cache_states = plan->n_rec_cache;  // as fitting sized them
  if (opt_.n_ubatch == model::kUbatchAuto) {
    opt_.n_ubatch = plan->n_ubatch;
    if (plan->n_ubatch > 512)
      KILN_LOG_INFO("--fit: steps of up to {} tokens (-ub auto: everything fits on {} with them; -ub sets it)",
                    plan->n_step, plan->gpu->name);
  }
  if (opt_.n_ctx == 0 && plan->n_ctx != model::resolve_total_context(0, shape->cfg.n_ctx_train)) {
    KILN_LOG_INFO("--fit: context {} (the training context does not fit; -c sets it explicitly)", plan->n_ctx);
    opt_.n_ctx = plan->n_ctx;
  }
  // Without a usable GPU the loader falls back to the CPU itself (and says why).
  if (!gpu) return opt_.n_gpu_layers;
  if (plan->n_cpu_moe != opt_.placement.n_cpu_moe) {
    KILN_LOG_INFO("--fit: the expert tensors of {} layer(s) on the host (--n-cpu-moe {}; set --cpu-moe, --n-cpu-moe or "
                  "-ot to choose)", plan->n_expert_host, plan->n_cpu_moe >= model::kCpuMoeAll ? std::string("all")
                                                                   : std::to_string(plan->n_cpu_moe));
    opt_.placement.n_cpu_moe = plan->n_cpu_moe;
  }
  return plan->n_gpu_layers;
}

void Engine::start_thread(std::string path) {
  thread_ = std::thread([this, p = std::move(path)]() mutable { thread_main(std::move(p)); });
}

void Engine::thread_main(std::string path) {
  if (!path.empty()) {
    auto fail = [&](const std::string& msg) {
      KILN_LOG_ERROR("{}", msg);
      {
        std::lock_guard<std::mutex> lk(impl_->pub_mu);
        load_error_ = msg;
      }
      state_.store(EngineState::Failed);
      state_.notify_all();
    };
    model::LoadOptions lo;
    lo.load_mode = opt_.load_mode;
    lo.n_gpu_layers = opt_.n_gpu_layers;
    lo.main_gpu = opt_.main_gpu;
    lo.mtp = opt_.spec.type == SpecType::DraftMtp;
    lo.progress = [this](size_t done, size_t total) { progress_.store(total ? float(done) / float(total) : 1.f); };
    gguf::OpenOptions oo;
    oo.load_mode = opt_.load_mode;
    auto file = gguf::File::open(path, oo);
    if (!file.ok()) return fail(file.error().message);
    // Plan (and fit) before anything is allocated.
    if (auto fitted = fit_memory(**file); !fitted.ok()) return fail(fitted.error().message);
    else lo.n_gpu_layers = *fitted;
    lo.placement = opt_.placement;  // as given, or the --n-cpu-moe fitting chose
    auto m = model::load_model(std::move(*file), lo);
    if (!m.ok()) return fail(m.error().message);
    model_ = std::move(*m);
    auto t = model::load_tokenizer(model_->file());
    if (!t.ok()) return fail(t.error().message);
    tok_ = std::move(*t);
    info_ = info_from_model(*model_, *tok_, path);
    if (Status vs = load_vision(); !vs.ok()) return fail(vs.error().message);
    auto r = make_runner(*model_, opt_);
    if (!r.ok()) return fail(path + ": " + r.error().message);
    if (opt_.spec.type == SpecType::DraftSimple) {
      auto d = load_draft_model(*r.value());
      if (!d.ok()) return fail(d.error().message);
      impl_->drafter = std::move(*d);
    }
    Status s = init_serving(std::move(*r));
    if (!s.ok()) return fail(path + ": " + s.error().message);
    if (opt_.warmup)
      if (Status w = warmup(); !w.ok()) return fail(path + ": warm-up: " + w.error().message);
    progress_.store(1.f);
    state_.store(EngineState::Ready);
    state_.notify_all();
  }
  impl_->run();
}

Status Engine::warmup() {
  Runner& r = *impl_->runner;
  const auto t0 = std::chrono::steady_clock::now();
  const bool gpu = model_ && model_->info().n_gpu_layers > 0;
  const int64_t n = std::min<int64_t>({gpu ? 72 : 2, r.n_batch(), r.n_ctx() - 1});
  if (n < 1) return {};
  model::Batch b;
  for (int64_t i = 0; i < n; ++i) b.add(0, int32_t(i), 0, i + 1 == n);
  KILN_TRY(r.decode(b));
  b.clear();
  b.add(0, int32_t(n), 0, true);
  KILN_TRY(r.decode(b));
  r.seq_clear(0);
  KILN_LOG_INFO("warm-up: {} + 1 tokens in {:.1f} ms", n,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return {};
}

std::unique_ptr<Engine> Engine::load_async(const std::string& path, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  e->start_thread(path.empty() ? std::string("<no model path>") : path);
  return e;
}

Result<std::unique_ptr<Engine>> Engine::load(const std::string& path, const EngineOptions& opt) {
  auto e = load_async(path, opt);
  KILN_TRY(e->wait_ready());
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<model::Model> m, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  auto t = model::load_tokenizer(m->file());
  KILN_TRY(t);
  e->tok_ = std::move(*t);
  e->model_ = std::move(m);
  e->info_ = info_from_model(*e->model_, *e->tok_, "");
  auto r = make_runner(*e->model_, opt);
  KILN_TRY(r);
  KILN_TRY(e->init_serving(std::move(*r)));
  e->progress_.store(1.f);
  e->state_.store(EngineState::Ready);
  e->start_thread({});
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Runner> runner, std::unique_ptr<tokenizer::Tokenizer> tok,
                                               ModelInfo info, const EngineOptions& opt) {
  auto e = std::unique_ptr<Engine>(new Engine());
  e->opt_ = opt;
  e->tok_ = std::move(tok);
  e->info_ = std::move(info);
  KILN_TRY(e->init_serving(std::move(runner)));
  e->progress_.store(1.f);
  e->state_.store(EngineState::Ready);
  e->start_thread({});
  return e;
}

Status Engine::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const EngineState s = state_.load();
    if (s == EngineState::Ready) return {};
    if (s == EngineState::Failed) return err("{}", load_error());
    if (timeout.count() >= 0 && Clock::now() >= deadline) return err("model still loading after {} ms", timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Engine::load_error() const {
  std::lock_guard<std::mutex> lk(impl_->pub_mu);
  return load_error_;
}

const ModelInfo& Engine::info() const {
  KILN_CHECK(ready(), "Engine::info() before the model is ready");
  return info_;
}

const tokenizer::Tokenizer& Engine::tokenizer() const {
  KILN_CHECK(ready(), "Engine::tokenizer() before the model is ready");
  return *tok_;
}

RequestHandle Engine::submit(Request req) {
  auto ch = std::make_shared<Channel>();
  ch->id = impl_->next_id.fetch_add(1);
  ch->inbox = impl_->inbox;
  {
    std::lock_guard<std::mutex> lk(impl_->pub_mu);
    impl_->metrics.requests_submitted++;
  }
  auto fail = [&](std::string msg) {
    {
      std::lock_guard<std::mutex> lk(impl_->pub_mu);
      impl_->metrics.requests_finished++;
      impl_->metrics.requests_failed++;
    }
    Event e;
    e.finish = FinishReason::Error;
    e.error = std::move(msg);
    ch->push(std::move(e));
    return RequestHandle(ch);
  };
  if (state_.load() == EngineState::Loading) return fail("the model is still loading");
  if (state_.load() == EngineState::Failed) return fail("the model failed to load: " + load_error());
  const int64_t P = int64_t(req.prompt.size());
  if (P == 0) return fail("prompt: empty (at least one token is needed)");
  if (P >= impl_->n_ctx_slot)
    return fail(fmt::format("prompt: {} tokens do not fit the context of {} tokens per slot", P, impl_->n_ctx_slot));
  if (!req.images.empty() && !impl_->vision) return fail("images: the server has no vision projector (--mmproj)");
  if (!req.images.empty() && req.embed) return fail("images: embeddings of prompts with images are not supported");
  {
    size_t k = 0;  // the image whose tokens come next
    for (size_t i = 0; i < req.prompt.size(); ++i) {
      while (k < req.images.size() && int64_t(i) >= req.images[k].pos + int64_t(req.images[k].nx) * req.images[k].ny) ++k;
      const bool in_img = k < req.images.size() && int64_t(i) >= req.images[k].pos;
      if (in_img) {
        const ImageInput& im = req.images[k];
        if (req.prompt[i] != image_token_id(im.hash, int64_t(i) - im.pos))
          return fail(fmt::format("prompt: token {} at index {} is not image {}'s token", req.prompt[i], i, k));
        continue;
      }
      if (req.prompt[i] < 0 || req.prompt[i] >= info_.n_vocab)
        return fail(fmt::format("prompt: token {} at index {} is outside the vocabulary [0, {})", req.prompt[i], i,
                                info_.n_vocab));
    }
    for (size_t j = 0; j < req.images.size(); ++j) {
      const ImageInput& im = req.images[j];
      const int unit = info_.vision_patch * info_.vision_merge;
      if (!im.chw || im.nx <= 0 || im.ny <= 0 || im.w != im.nx * unit || im.h != im.ny * unit ||
          im.chw->size() != size_t(3) * size_t(im.w) * size_t(im.h) || im.pos < 0 ||
          im.pos + int64_t(im.nx) * im.ny > P || (j > 0 && im.pos < req.images[j - 1].pos + int64_t(req.images[j - 1].nx) * req.images[j - 1].ny))
        return fail(fmt::format("images[{}]: inconsistent size or position", j));
    }
  }
  // The first token mask of a grammar is computed here, on the submitting thread, so that the
  // request's first constrained step on the engine thread is a lookup (GrammarCache::prepare).
  if (req.grammar && !req.prepared_grammar && impl_->grammars) {
    std::sort(req.preserved_tokens.begin(), req.preserved_tokens.end());
    req.prepared_grammar = impl_->grammars->prepare(req.grammar, req.preserved_tokens);
  }
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    impl_->inbox->pending.push_back({ch, std::move(req), Clock::now()});
  }
  impl_->inbox->cv.notify_one();
  return RequestHandle(ch);
}

Result<Engine::SlotActionResult> Engine::slot_action(SlotAction action, int slot, const std::string& path) {
  if (!ready()) return err("the model is not loaded");
  auto done = std::make_shared<std::promise<Result<SlotActionResult>>>();
  auto fut = done->get_future();
  {
    std::lock_guard<std::mutex> lk(impl_->inbox->mu);
    if (impl_->inbox->stop) return err("the engine is stopping");
    impl_->inbox->tasks.push_back(
        [this, done, action, slot, path] { done->set_value(impl_->slot_action(action, slot, path)); });
  }
  impl_->inbox->wake();
  return fut.get();
}

Metrics Engine::metrics() const {
  Metrics m;
  {
    std::lock_guard<std::mutex> lk(impl_->pub_mu);
    m = impl_->metrics;
  }
  // Requests still in the inbox (not yet seen by the engine thread) count as queued.
  std::lock_guard<std::mutex> lk(impl_->inbox->mu);
  m.queue_length += int(impl_->inbox->pending.size());
  return m;
}

std::vector<SlotInfo> Engine::slots() const {
  std::lock_guard<std::mutex> lk(impl_->pub_mu);
  return impl_->slot_info;
}

}  // namespace kiln::engine
