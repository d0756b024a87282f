// engine/engine.h — the inference engine: one engine thread that owns the model, its memory
//   (n_parallel slots) and the prefix cache, and runs continuous batching over submitted requests.
//   The server's whole view of inference is this header.
//
// Owns: the Model (when loaded from a path), the Tokenizer, a Runner (Context + Memory), the
//   PrefixCache, the request queue and every running request's sampler and detokenizer.
// Must not: see JSON, chat templates or HTTP. Requests arrive as token ids + typed parameters.
//
// Threading:
//   - Engine::load_async() returns at once; the engine thread loads the model, then serves.
//     state() / wait_ready() tell loading / ready / failed (for /health 503 while loading).
//   - submit(), cancel (RequestHandle), metrics(), slots(), info() and tokenizer() may be called
//     from any thread. tokenizer() is immutable (encode/decode are const and thread-safe); it and
//     info() are valid once state() == Ready.
//   - Each RequestHandle is read by one consumer thread: next(timeout) pops events in order.
//     Destroying a handle before its final event cancels the request.
//   - Images (--mmproj) are encoded on a task thread of their own (std::async, one encode at a
//     time); the engine thread only starts them and takes their results between steps.
//
// Scheduling (see docs/engine.md): every step builds one model::Batch of at most `step_tokens`
//   (= min(n_batch, n_ubatch)) tokens: first one decode token for every generating request, then
//   prefill chunks of admitted requests, oldest first. A long prompt therefore delays the others'
//   next token by at most one chunk. Requests wait in FIFO order while all slots are busy.
//
// Prefix cache (see engine/prefix_cache.h, docs/engine.md): on admission the engine reuses the
//   longest cached prefix from the slot's own content or from the cross-slot radix tree (restoring
//   KV rows and, for hybrid models, a recurrent-state snapshot). Event::timings.cache_n reports it.
//
// Constrained decoding (see engine/grammar_matcher.h): each running request with a grammar has its
//   own matcher; automata are shared by requests with the same grammar (engine thread only).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/result.h"
#include "engine/grammar.h"
#include "engine/runner.h"
#include "engine/sampling.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kiln::engine {

class GrammarAutomaton;  // engine/grammar_matcher.h

// ---------------------------------------------------------------------------------------------
// Options

struct EngineOptions;
// EngineOptions::cache_states resolved (0 with the prefix cache off).
int resolve_cache_states(const EngineOptions& o);
// EngineOptions::delta_chunk_min resolved for a model with (gpu) or without layers on a GPU.
int resolve_delta_chunk(const EngineOptions& o, bool gpu);

struct EngineOptions {
  int64_t n_ctx = 0;           // -c: total context; each slot gets n_ctx / n_parallel positions.
                               //     0: the model's training context (per slot: n_ctx_train / n_parallel,
                               //     at least 1).
  int n_parallel = 1;          // -np: slots
  int64_t n_batch = 2048;      // -b: logical batch
  int64_t n_ubatch = 0;        // -ub: physical batch; one step decodes at most min(n_batch, n_ubatch).
                               //     0 (auto, model::kUbatchAuto): load() resolves it with the memory plan
                               //     (2048 where everything fits on the GPU with it, else 512)
  int n_threads = 0;           // -t: compute threads (<= 0: all cores / KILN_THREADS)
  model::GgmlType type_k = model::GgmlType::F16;  // -ctk
  model::GgmlType type_v = model::GgmlType::F16;  // -ctv
  LoadMode load_mode = LoadMode::Mmap;  // --load-mode
  int n_gpu_layers = model::kGpuLayersAuto;  // -ngl (model::LoadOptions::n_gpu_layers)
  int main_gpu = 0;                          // --main-gpu
  // --cpu-moe / --n-cpu-moe / -ot (model/placement.h): expert tensors of GPU layers in host memory.
  // Left unset on a MoE model with -ngl auto, fitting may choose --n-cpu-moe (docs/memory.md).
  model::PlacementOptions placement;
  int64_t cache_ram_bytes = int64_t(8192) << 20;  // --cache-ram (MiB * 2^20): <0 unlimited, 0 off
  int32_t cache_block = 32;                       // prefix-cache block size (tokens)
  // Hybrid models: prefix-cache recurrent states kept in spare state slots where the layers run (a
  // restore or a snapshot is then a device copy, not a host round trip; older states move to RAM).
  // -1: n_parallel + 4 (at most 64), and with a GPU and --fit on fitting decides: none when the plan
  // does not fit, else up to 10 % of the usable GPU memory (at most 256); 0: every state in RAM.
  int cache_states = -1;
  // llama-server's --warmup: before serving, one prompt-sized step (72 tokens when layers are on a
  // GPU: cuBLAS set-up and every prefill kernel's first load; 2 on the CPU) and one decode step (its
  // graph) on slot 0, which is then cleared. Off: the first request pays for them.
  bool warmup = true;
  // Hybrid models: recurrent-state snapshots during a prefill every this many tokens (rounded up to
  // a multiple of cache_block); the ends of prompts and of generated turns are always snapshotted.
  int64_t cache_snapshot_interval = 512;
  // Hybrid models: also snapshot just before chat turn starts (later occurrences of the prompt's first
  // control token, e.g. "<|im_start|>"): the first two and the last two of them. Prompts of different
  // requests diverge there (a shared system prompt followed by different user messages; an edited
  // last message). Each snapshot costs one recurrent state (Runner::rec_floats() floats).
  bool snapshot_before_control = true;
  // Hybrid prefill: runs of at least this many tokens use the chunked gated-delta form
  // (model::ContextOptions::delta_chunk_min; 0 = never). Faster prefill, but results then depend
  // slightly on how prompts are split into chunks (the prefix cache changes the split). -1 (`--delta-chunk
  // auto`): 64 when layers run on a GPU without batch_invariant (whose kernels depend on the batch
  // anyway), 0 on the CPU (batch-invariant by default); resolve_delta_chunk.
  int delta_chunk_min = -1;
  // false (`-fa off`): llama.cpp's non-flash attention arithmetic (model::ContextOptions::flash_attn):
  // bit-identical to llama.cpp on AVX-512 hosts, but results depend on batch composition.
  bool flash_attn = true;
  // --batch-invariant (model::ContextOptions::batch_invariant): a token's results do not depend on the
  // batch it is in or on how its prompt was split (the prefix cache changes the split), on the GPU too.
  bool batch_invariant = false;
  // --embedding: the runner also keeps the normed hidden state of every output row, so requests
  // with Request::embed get embeddings (costs n_embd floats per output row of host memory).
  bool embeddings = false;
  // Memory planning and fitting (model/fit.h, docs/memory.md): before loading, the plan of every
  // part is computed from the file's metadata and logged as a table; with fit on, -ngl auto and an
  // unset -c are chosen so that it fits the GPU's free memory (capped by device_memory) minus
  // fit_target; explicit values that do not fit fail the load with the parts named.
  bool fit = true;                   // --fit on|off
  uint64_t fit_target = uint64_t(1024) << 20;  // --fit-target (bytes; the GPU used)
  int64_t fit_ctx = 4096;            // --fit-ctx: the smallest context fitting may choose
  uint64_t device_memory = 0;        // --device-memory / KILN_DEVICE_MEMORY: cap on usable GPU memory (0: none)
  std::string mmproj;                // --mmproj: the vision projector (model/vision.h), counted in the plan
  bool mmproj_offload = true;        // --mmproj-offload / --no-mmproj-offload: the projector on the GPU when one is usable
  int64_t image_max_tokens = 4096;   // --image-max-tokens: the largest image batch the memory plan counts
  // Speculative decoding (--spec-type and its flags; engine/speculative.h, docs/engine.md).
  SpecOptions spec;
};

// ---------------------------------------------------------------------------------------------
// Requests and events

// How an embedding request reduces the prompt's hidden states (after the output norm), as
// llama.cpp's pooling types: None keeps every token's, Mean averages them, Cls takes the first
// token's, Last the last token's.
enum class Pooling { None, Mean, Cls, Last };

// An image in a prompt (vision, --mmproj): its preprocessed pixels (media::preprocess) and where its
// tokens are. The prompt holds nx * ny image tokens at [pos, pos + nx * ny): ids that only name the
// image for the prefix cache (image_token_id(hash, i), outside the vocabulary); the engine encodes
// the image on its thread when the first of its tokens is prefilled (not at all when the prefix
// cache holds them) and gives the text model their embeddings with M-RoPE positions
// (p0, p0 + y, p0 + x); the text after an image continues at p0 + max(nx, ny) (llama.cpp's mtmd).
struct ImageInput {
  std::shared_ptr<const std::vector<float>> chw;  // planar [3][h][w], normalised
  int w = 0, h = 0;
  int nx = 0, ny = 0;      // token grid (w / (patch * merge), h / (patch * merge))
  uint64_t hash = 0;       // content hash (media::image_hash)
  int64_t pos = 0;         // index in Request::prompt of the image's first token
};
// The prompt id of image token i of the image with this content hash: >= 2^30, so never a
// vocabulary id; equal for equal images at equal offsets (the prefix cache matches on ids).
inline int32_t image_token_id(uint64_t hash, int64_t i) {
  return int32_t((1u << 30) | (uint32_t((hash ^ (hash >> 32)) + uint64_t(i) * 0x9E3779B1u) & 0x3fffffffu));
}

struct Request {
  std::vector<int32_t> prompt;     // token ids (already templated and tokenized; BOS included if wanted)
  SamplingParams sampling;
  int32_t max_tokens = -1;         // n_predict / max_tokens: -1 = until EOG or the slot's context is full
  std::vector<std::string> stop;   // stop strings: never emitted, even split across tokens
  std::vector<int32_t> stop_tokens;  // extra stop token ids (not emitted as text)
  bool ignore_eos = false;         // keep generating after end-of-generation tokens (they are not stopped on)
  int32_t n_probs = 0;             // logprobs: > 0 gives each token's logprob and this many top alternatives;
                                   // -1: the logprob only (OpenAI logprobs=true, top_logprobs=0)
  bool render_special = false;     // detokenize control tokens as text (llama.cpp "special")
  // Control tokens that stand for their text in this request (a tool-call format's markers,
  // llama-server's preserved tokens): detokenized as text, and a grammar matches them by that text,
  // so that a constrained model can write "[TOOL_CALLS]" as the one token it was trained on.
  std::vector<int32_t> preserved_tokens;
  bool cache_prompt = true;        // use / fill the prefix cache
  // Hybrid models: prompt positions where a recurrent-state snapshot should be kept (e.g. the end of
  // the system message, known to the server from the chat template), in addition to the engine's own
  // points (see EngineOptions::snapshot_before_control). Ignored for attention-only models.
  std::vector<int64_t> snapshot_at;
  // Constrained decoding: every generated token must continue a derivation of this grammar
  // (engine/grammar.h; the server compiles it from GBNF or a JSON schema). End-of-generation is
  // allowed only where the grammar is complete, and the request stops once nothing else can
  // follow. nullptr: unconstrained.
  std::shared_ptr<const Grammar> grammar;
  // Set by Engine::submit (on the submitting thread): the grammar's automaton with its first token
  // mask computed, adopted by the engine when its cache does not hold the grammar yet.
  std::shared_ptr<GrammarAutomaton> prepared_grammar;
  // Non-empty: the grammar applies only after this text appears in the output (the end of a
  // reasoning section, "</think>"); bytes after it in the same token are matched.
  std::string grammar_trigger;
  // Embedding request (needs EngineOptions::embeddings): the prompt is processed without the
  // prefix cache (every token's hidden state is needed), nothing is generated, and the final
  // Event carries Event::embedding, reduced by `pooling` (no normalization: the server's choice).
  bool embed = false;
  Pooling pooling = Pooling::Mean;
  // Images (needs a projector: EngineOptions::mmproj), ordered by pos, not overlapping.
  std::vector<ImageInput> images;
};

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "", "stop", "length", "cancelled", "error"

struct Timings {
  int64_t prompt_n = 0;      // prompt tokens processed (not reused)
  int64_t cache_n = 0;       // prompt tokens reused from the prefix cache / slot
  double prompt_ms = 0;      // admission → first token (prompt processing)
  int64_t predicted_n = 0;   // tokens generated
  double predicted_ms = 0;   // first token → finish
  double queue_ms = 0;       // submit → admission
  int64_t draft_n = 0;           // speculative decoding: draft tokens verified (llama-server's names)
  int64_t draft_n_accepted = 0;  // of which accepted
};

struct TokenOut {
  int32_t id = -1;
  std::string piece;                 // token_to_piece(id, render_special): this token's bytes
  TokenLogprob logprob;              // valid when Request::n_probs != 0
  std::vector<TokenLogprob> top;     // n_probs alternatives (descending)
};

struct Event {
  std::vector<TokenOut> tokens;  // tokens generated since the previous event (usually one)
  std::string text;              // new text (UTF-8 complete; stop strings and their possible
                                 // beginnings held back until decided)
  FinishReason finish = FinishReason::None;  // != None: the final event of the request
  std::string stop_word;         // the stop string that ended it (FinishReason::Stop), if any
  std::string error;             // FinishReason::Error: why
  Timings timings;               // on the final event
  // Embedding requests, final event: n_embd floats (pooled), or prompt length x n_embd (Pooling::None).
  std::vector<float> embedding;
  bool final() const { return finish != FinishReason::None; }
};

class Engine;
class DraftModel;
struct Channel;

// The consumer's end of a request. Movable; destroying it before the final event cancels the request.
class RequestHandle {
 public:
  RequestHandle() = default;
  explicit RequestHandle(std::shared_ptr<Channel> ch);
  RequestHandle(RequestHandle&&) noexcept = default;
  RequestHandle& operator=(RequestHandle&& o) noexcept;
  ~RequestHandle();

  uint64_t id() const;
  // Next event, waiting at most `timeout`; nullopt on timeout or after the final event was taken.
  std::optional<Event> next(std::chrono::milliseconds timeout);
  // Asks the engine to stop the request and free its slot; a final Cancelled event follows.
  void cancel();
  bool done() const;  // the final event has been taken

 private:
  std::shared_ptr<Channel> ch_;
};

// ---------------------------------------------------------------------------------------------
// Introspection

struct ModelInfo {
  std::string arch;            // general.architecture
  std::string name;            // general.name
  std::string path;            // model file
  std::string chat_template;   // tokenizer.chat_template ("" if absent)
  int64_t n_ctx = 0;           // total context (n_ctx_slot * n_parallel)
  int64_t n_ctx_slot = 0;      // positions per slot
  int64_t n_ctx_train = 0;
  int pooling_type = -1;  // the GGUF's <arch>.pooling_type (llama.cpp's numbering), -1 absent
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;         // trunk layers
  int64_t n_params_bytes = 0;  // weight bytes
  bool hybrid = false;
  int32_t bos = -1, eos = -1, eot = -1;
  bool add_bos = false;
  std::vector<int32_t> eog_ids;
  std::string bos_text, eos_text;  // token texts ("" if none)
  // Vision (--mmproj loaded): the projector's preprocessing (patch, merge, mean, std) and its path.
  bool vision = false;
  std::string mmproj;
  int vision_patch = 0, vision_merge = 0;
  float vision_mean[3] = {0, 0, 0}, vision_std[3] = {1, 1, 1};
};

struct Metrics {
  uint64_t requests_submitted = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;
  uint64_t prompt_tokens = 0;        // processed (llama-server prompt_tokens_total)
  double prompt_seconds = 0;
  uint64_t predicted_tokens = 0;     // tokens_predicted_total
  double predicted_seconds = 0;
  uint64_t decode_calls = 0;         // n_decode_total
  uint64_t busy_slot_steps = 0;      // sum over decode calls of busy slots (n_busy_slots_per_decode = /decode_calls)
  uint64_t cache_requests_hit = 0;   // requests that reused > 0 tokens
  uint64_t cache_tokens_reused = 0;  // sum of cache_n
  uint64_t cache_bytes = 0;          // prefix-cache bytes held now
  uint64_t cache_entries = 0;        // blocks + tails held now
  uint64_t cache_states = 0;         // recurrent snapshots held now
  uint64_t cache_evictions = 0;
  int busy_slots = 0;                // now
  int queue_length = 0;              // requests waiting for a slot now
  int64_t max_tokens_seen = 0;       // largest n_past of any slot (llama-server n_tokens_max)
  uint64_t draft_tokens = 0;         // speculative decoding: draft tokens verified (n_draft_total)
  uint64_t draft_tokens_accepted = 0;  // of which accepted (n_draft_accepted_total)
  uint64_t mtp_deferred_steps = 0;     // draft-mtp: decode steps that deferred the MTP catch-up
  uint64_t mtp_flushes = 0;            // and the batched passes that caught up
};

struct SlotInfo {
  int id = 0;
  bool busy = false;
  uint64_t request_id = 0;
  int64_t n_ctx = 0;
  int64_t n_past = 0;        // positions in memory
  int64_t n_prompt = 0;
  int64_t n_decoded = 0;
  int64_t cache_n = 0;
  int64_t draft_n = 0, draft_n_accepted = 0;  // the running request's speculative counts
};

enum class EngineState { Loading, Ready, Failed };

// ---------------------------------------------------------------------------------------------

class Engine {
 public:
  // Starts the engine thread, which loads the model at `path` and then serves. Never fails here;
  // a load error is reported by state() == Failed / wait_ready().
  static std::unique_ptr<Engine> load_async(const std::string& path, const EngineOptions& opt);
  // load_async + wait_ready.
  static Result<std::unique_ptr<Engine>> load(const std::string& path, const EngineOptions& opt);
  // From a loaded model (kept alive by the engine).
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<model::Model> m, const EngineOptions& opt);
  // From any Runner (tests: fake models). info must carry n_vocab/eog ids consistent with the runner.
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<Runner> runner,
                                                std::unique_ptr<tokenizer::Tokenizer> tok, ModelInfo info,
                                                const EngineOptions& opt);
  ~Engine();  // stops the thread; unfinished requests get a final Cancelled event
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  EngineState state() const { return state_.load(); }
  bool ready() const { return state() == EngineState::Ready; }
  // Waits until Ready (ok) or Failed (the load error). timeout < 0: forever.
  Status wait_ready(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  std::string load_error() const;
  float load_progress() const { return progress_.load(); }  // 0..1 while loading

  const ModelInfo& info() const;                   // Ready only
  const tokenizer::Tokenizer& tokenizer() const;   // Ready only; thread-safe const methods
  const EngineOptions& options() const { return opt_; }

  // Queues a request. Bad requests (empty prompt, prompt that does not fit a slot, token ids outside
  // the vocabulary) still return a handle whose only event is a final Error naming the problem.
  RequestHandle submit(Request req);

  Metrics metrics() const;
  std::vector<SlotInfo> slots() const;

  // llama-server's slot actions (POST /slots/{id}?action=…): save the slot's content (tokens, KV
  // rows, recurrent state) to `path` (engine/slot_file.h), restore it from there (the file must
  // match this model and cache layout, and fit the slot), or erase it. Run on the engine thread
  // between steps; the slot must be idle. n_tokens: tokens saved / restored / erased.
  enum class SlotAction { Save, Restore, Erase };
  struct SlotActionResult {
    int64_t n_tokens = 0;
    uint64_t n_bytes = 0;  // written (save) or read (restore)
    double ms = 0;
  };
  Result<SlotActionResult> slot_action(SlotAction action, int slot, const std::string& path);

  struct Impl;

 private:
  Engine();
  void thread_main(std::string path);
  // Plans the run's memory from the file's metadata (logs the table); fits -ngl auto and an unset
  // -c as EngineOptions::fit asks (an unset -c that fitting lowered is written into opt_.n_ctx).
  // Returns the -ngl to load with.
  Result<int> fit_memory(const gguf::File& f);
  void start_thread(std::string path);
  Status init_serving(std::unique_ptr<Runner> runner);
  Status warmup();  // EngineOptions::warmup, after init_serving
  Result<std::unique_ptr<DraftModel>> load_draft_model(const Runner& target);  // --spec-type draft-simple

  Status load_vision();
  EngineOptions opt_;
  std::atomic<EngineState> state_{EngineState::Loading};
  std::atomic<float> progress_{0};
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::Model> draft_model_;  // -md (used by Impl::drafter, destroyed after it)
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  ModelInfo info_;
  std::string load_error_;  // guarded by Impl::pub_mu
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace kiln::engine
