// model/fit.h — the memory planner: everything a run allocates, per device (the host and the CUDA
//   device the layers go to), counted from the GGUF metadata and tensor table and the options before
//   anything is allocated; and fitting (`--fit`, as llama-server): the context (when -c was left
//   unset) and then the number of GPU layers (when -ngl is auto) chosen so that the plan fits the
//   device's free memory minus a margin. Explicit values are never changed: a plan that does not fit
//   them is an error naming every part and its size.
// Owns: the plan's parts and their arithmetic where no other module owns it (weights per device by
//   llama-server's -ngl rule, the MTP head, the projector and its image batch, the prefix cache). The
//   parts that allocations make are counted with the allocators' own functions: Memory::layout (KV,
//   recurrent state), plan_scratch / step_workspace (model/scratch.h: Context's Arena and workspaces),
//   backend::workspace_sizes (the streams' workspace arithmetic, CUDA's too in builds without CUDA),
//   packed_weight_bytes (the loader's upload packing).
// Must not: read tensor data, allocate device memory, or load the model (plan_memory and fit work
//   on a metadata-only gguf::File; `kiln fit` runs without a GPU).
// Threading: pure functions of their inputs.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "model/model.h"

namespace kiln::model {

// A model as the planner sees it: its config (as load_config reads it, n_vocab and tied embeddings
// resolved as load_model resolves them) and its tensor table. No tensor data is needed.
struct ModelShape {
  std::string path;
  ModelConfig cfg;
  const gguf::File* file = nullptr;  // the tensor table (not owned; outlives the shape)
  static Result<ModelShape> from_file(const gguf::File& f);
  const gguf::TensorInfo* find(const std::string& name) const { return file->find_tensor(name); }
};

// A vision projector (--mmproj) as the planner sees it: its tensor bytes and what the encoder's
// scratch depends on (clip.vision.* keys, the merger and DeepStack tensors' shapes).
struct ProjectorShape {
  std::string path;
  uint64_t weight_bytes = 0;
  int64_t n_embd = 0, n_ff = 0, n_head = 0, patch_size = 0, merge = 1;  // clip.vision.*
  int64_t n_mff = 0, n_out_total = 0;  // the widest merger MLP row; floats per image token
  static Result<ProjectorShape> from_file(const gguf::File& f);
};

// The run being planned (the values the engine / tools would use; see resolve_context()).
struct PlanOptions {
  int64_t n_ctx = 0;             // -c: total context shared by the slots; 0 = unset (the training context)
  int n_parallel = 1;            // -np: slots
  int64_t n_batch = 2048;        // -b
  int64_t n_ubatch = 512;        // -ub: a step holds min(n_batch, n_ubatch) (at least n_parallel) tokens;
                                 // kUbatchAuto: fit_plan resolves it (MemoryPlan::n_ubatch), plan_memory takes 512
  int64_t n_outputs_max = 0;     // Context's logits rows (0 = the step's tokens, as ContextOptions)
  int n_top = 0;                 // ContextOptions::n_top: each output row's top logits selected on the device
  gguf::GgmlType type_k = gguf::GgmlType::F16, type_v = gguf::GgmlType::F16;  // -ctk / -ctv
  int n_threads = 0;             // -t (CPU workspaces depend on it)
  int delta_chunk_min = 0;
  bool flash_attn = true;
  int n_gpu_layers = kGpuLayersAuto;  // -ngl (N, kGpuLayersAll, kGpuLayersAuto)
  int main_gpu = 0;              // -mg: the CUDA<i> that -ot rules may name
  // --cpu-moe / --n-cpu-moe / -ot (model/placement.h): expert tensors of GPU blocks on the host. Left
  // unset (given() false) on a MoE model with -ngl auto, fitting moves experts before layers.
  PlacementOptions placement;
  int64_t cache_ram_bytes = 0;   // --cache-ram in bytes (< 0 unlimited: not counted, said so)
  bool spec_mtp = false;         // --spec-type draft-mtp: the MTP head, its KV and draft scratch
  int64_t n_draft = 3;           // draft tokens per step (--spec-draft-n-max; llama-server's and kiln serve's default)
  int n_spec = 0;                // speculative decoding: recurrent keep slots per sequence (MemoryOptions::n_spec)
  int n_rec_cache = 0;           // prefix cache: spare recurrent state slots (MemoryOptions::n_rec_cache)
  bool rec_cache_auto = false;   // n_rec_cache was not asked for: fitting drops the slots before anything
                                 // else, and where the plan fits grows them into at most 10 % of the GPU
  int64_t image_max_tokens = 4096;  // image tokens (after the projector's merge) one image may give (--image-max-tokens, as kiln serve)
  // --spec-type draft-simple: the draft model (-md), planned as the engine runs it — its weights with
  // draft_n_gpu_layers (-ngld; auto: all) on the GPU, its KV (-ctkd/-ctvd) and recurrent state with
  // n_draft + 1 keep slots for every slot at the target's slot context, its Context (steps of
  // max(step, slots x (n_draft + 2)) tokens, one logits row per slot); parts named "draft ...".
  const ModelShape* draft = nullptr;  // not owned
  int draft_n_gpu_layers = kGpuLayersAuto;
  gguf::GgmlType draft_type_k = gguf::GgmlType::F16, draft_type_v = gguf::GgmlType::F16;
};

// Where memory is planned and how much may be used there.
struct DeviceBudget {
  std::string name;              // "CUDA0" (or "CUDA0 (simulated)")
  uint64_t free = 0;             // free memory now (or --device-memory when simulated)
  uint64_t cap = 0;              // --device-memory / KILN_DEVICE_MEMORY (0: none)
  uint64_t target = uint64_t(1024) << 20;  // --fit-target margin kept free
  int sm = 90;                   // compute capability (cuBLAS workspace size)
  uint64_t context = 0;          // kiln's CUDA context (backend::cuda_context_bytes), a part of the plan;
                                 // a real device's free memory is already net of it
  uint64_t available() const;    // min(free + context, cap): what the process may hold on the device
  uint64_t usable() const;       // available() - target (0 when the margin exceeds it)
};

struct FitOptions {
  bool fit = true;               // --fit on|off
  int64_t fit_ctx = 4096;        // --fit-ctx: the smallest context fitting may choose
};

// One part of the plan: bytes on the host and on the GPU.
struct PlanPart {
  std::string name;              // "weights", "KV cache", ...
  std::string detail;            // how it was counted ("8 attention layers x 65536 x 1 slot, f16/f16")
  uint64_t host = 0, gpu = 0;
  bool estimate = false;         // a stated estimate rather than an allocation kiln makes today
};

struct MemoryPlan {
  std::string model;             // path
  int64_t n_layer = 0;
  int n_gpu_layers = 0;          // resolved count: layers il >= n_layer - n on the GPU; > n_layer: the output too
  bool output_on_gpu = false;
  int n_cpu_moe = 0;             // --n-cpu-moe the plan was made with (fitting may choose it; kCpuMoeAll: --cpu-moe)
  int64_t n_expert_host = 0;     // GPU blocks (trunk and MTP) whose expert tensors are on the host
  int64_t n_ctx = 0, n_ctx_slot = 0;  // total and per slot
  int n_parallel = 1;
  int n_rec_cache = 0;           // spare recurrent state slots planned (0 without recurrent layers)
  int64_t n_ubatch = 512;        // -ub as planned (kUbatchAuto resolved)
  int64_t n_step = 0;            // tokens per step (Context n_batch)
  std::optional<DeviceBudget> gpu;  // none: the CPU only
  std::vector<PlanPart> parts;
  uint64_t host_total() const;
  uint64_t gpu_total() const;
  bool fits() const { return !gpu || gpu_total() <= gpu->usable(); }
  // The table printed at startup and by `kiln fit` (MiB per part and device, totals, the budget).
  std::string table() const;
  // "weights 4980 MiB, KV cache 2048 MiB, ..." (GPU parts), for errors.
  std::string gpu_parts() const;
};

// The total context and the per-slot context the engine uses for -c n_ctx (0: the training context,
// else 4096) with np slots: per slot max(1, total / np).
int64_t resolve_total_context(int64_t n_ctx, int64_t n_ctx_train);
int64_t slot_context(int64_t total, int n_parallel);
// -ub auto (kiln serve's default): fit_plan takes kUbatchLarge where the fitted plan keeps every layer, its
// experts and the output on the GPU and still fits with steps that large (prompt steps of 2,048 tokens
// dequantize each weight once per 2,048 tokens instead of four times: +28-40 % prefill on an H100/H200),
// else 512; the context, the layers and the experts are fitted first (at 512), so a large step never costs
// context.
inline constexpr int64_t kUbatchAuto = 0;
inline constexpr int64_t kUbatchLarge = 2048;
// Tokens per step as the engine sizes its Context: max(min(n_batch, n_ubatch), n_parallel) (auto: 512).
int64_t step_tokens(int64_t n_batch, int64_t n_ubatch, int n_parallel);
// -ngl as the loader resolves it given whether a GPU is used: 0..n_layer + 1.
int resolve_gpu_layers(int n_gpu_layers, int64_t n_layer, bool have_gpu);

// The plan for these options with `ngl` resolved layers on `gpu` (none: all on the CPU). Errors:
// options the runtime would refuse (cache type, sizes), --spec-type draft-mtp without an MTP block.
Result<MemoryPlan> plan_memory(const ModelShape& m, const ProjectorShape* proj, const PlanOptions& o, int ngl,
                               const std::optional<DeviceBudget>& gpu);

// Fitting: the plan kiln runs with. With a GPU and fit on: -ngl auto tries all layers first; a
// context left unset is lowered (down to fit_ctx) before layers are; on a MoE model with no
// --cpu-moe / --n-cpu-moe / -ot, the expert tensors of the first N layers go to the host next (the
// smallest N that fits; an unset context then grows back to the largest that fits with it); then the
// most layers that fit (with every expert on the host).
// Explicit -c / -ngl / expert flags are kept; if the plan with them does not fit, the error names
// each GPU part.
// fit off: the values as given (auto = all layers on a GPU), no check. Without a GPU: the CPU plan.
Result<MemoryPlan> fit_plan(const ModelShape& m, const ProjectorShape* proj, const PlanOptions& o,
                            const FitOptions& f, const std::optional<DeviceBudget>& gpu);

// Sizes as flags take them: "8GiB", "8G", "8192M", "8192MiB", "512K", plain bytes. Errors name `what`.
Result<uint64_t> parse_memory_size(const std::string& s, const char* what);
// --fit-target "MiB[,MiB...]": the first value applies to the (one) GPU used.
Result<std::vector<uint64_t>> parse_fit_target(const std::string& s);

// The GPU budget for main_gpu: the driver's free memory capped by device_memory, or — without a
// usable GPU and with simulate — a simulated device of device_memory bytes. nullopt: plan for the CPU.
std::optional<DeviceBudget> gpu_budget(int main_gpu, uint64_t device_memory, uint64_t target, bool simulate);

}  // namespace kiln::model
