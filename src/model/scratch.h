// model/scratch.h — what a Context allocates per device besides Memory, as functions of the config
//   and options alone: the scratch Arena's layout (activations for n_batch tokens, the output rows,
//   per-token inputs) and the largest op workspace a step needs. Context allocates with these and
//   the memory planner (model/fit.h) counts with them, so a plan cannot drift from the allocations.
// Must not: allocate (plan_scratch only reserves offsets in an Arena), run ops, or see Models (a
//   weight is described by its MatShape).
// Threading: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/reader.h"
#include "model/config.h"

namespace kiln::model {

// Arena offsets of one device's scratch (planned for n_batch tokens; kNone: not on this device).
struct ScratchPlan {
  static constexpr size_t kNone = SIZE_MAX;
  size_t x = kNone, cur = kNone, tmp = kNone, q = kNone, k = kNone, v = kNone, att = kNone, fa = kNone, fb = kNone;
  size_t mixed = kNone, z = kNone, beta = kNone, g = kNone, dout = kNone;
  size_t router = kNone, ids = kNone, wts = kNone, ye = kNone;
  size_t pos = kNone, seq = kNone, tok = kNone, mpos = kNone;
  size_t rseq = kNone, keep = kNone;  // hybrid: recurrent state slot and keep slot per token (Memory::rec_slot)
  size_t out_idx = kNone, hidden = kNone, logits = kNone;
  size_t top_ids = kNone, top_vals = kNone;  // I32 / F32 [n_top, n_out_max] (ScratchRole::n_top)
  // MTP (ContextOptions::mtp, on the MTP block's device): embeddings [E, B], normed hidden states [E, B],
  // previous hidden states [E, B + 1], the eh_proj input [2E, B], I32 [B] indices.
  size_t emb = kNone, hall = kNone, hprev = kNone, cat = kNone, hidx = kNone;
  size_t dids = kNone, dprob = kNone;  // MTP drafts: each row's argmax and its probability [n_out_max]
};

// MTP drafts of at most this many positions run as one recorded graph (model/mtp.cpp), with
// page-locked host rows: ids and probabilities [kDraftGraphMax, n_out_max], embeddings [E, n_out_max].
constexpr int kDraftGraphMax = 16;

// What runs on a device: the host (token ids, embeddings), trunk layers, the output (norm + matrix).
struct ScratchRole {
  bool host = false, layers = false, output = false;
  bool mtp = false;  // the MTP block's inputs are here (the host's embeddings, the block's device): a layer's activations and its own inputs
  // The routed experts of blocks on another device run here (their weights are here: --cpu-moe):
  // the FFN input, the router's ids, the hidden slots and the expert outputs.
  bool experts = false;
  int n_top = 0;  // with `output`: each output row's n_top largest logits too (ContextOptions::n_top)
  bool mtp_block = false;  // with `mtp`: the block runs here (its drafts' rows [E, n_out_max] when the output is elsewhere)
};

// Reserves one device's scratch in A (the residual stream always; block activations and per-token
// inputs where layers run; the output rows where the output runs, and on a non-host device the
// logits [V, n_out_max] too — the host's logits are Context's own vector). A.planned() is then the
// Arena's size.
void plan_scratch(const ModelConfig& c, int64_t n_batch, int64_t n_out_max, const ScratchRole& role,
                  backend::Arena& A, ScratchPlan& p);

// A weight as a mat-mul sees it: type, k = ne[0], n = ne[1]; expert: a [k, n, n_expert] stack
// (matmul_id over K * n_batch slots).
struct MatShape {
  gguf::GgmlType type = gguf::GgmlType::F32;
  int64_t k = 0, n = 0;
  bool expert = false;
};

// The mat-mul weights of trunk layer il as Context runs them (by GGUF name, as the loader binds
// them: attention or delta-net projections, dense or expert FFN, router, shared expert; the shared
// expert's gate vector is bound as F32). `find` looks a tensor up by name (nullptr: absent).
using TensorLookup = std::function<const gguf::TensorInfo*(const std::string&)>;
std::vector<MatShape> layer_mats(const TensorLookup& find, int64_t il);
// The output matrix: output.weight, or token_embd.weight when tied. nullopt when neither exists.
std::optional<MatShape> output_mat(const TensorLookup& find);

// The largest workspace any op of a step needs on one device at n_batch tokens, attention aside:
// the mat-muls of its layers (`mats`), the gated delta rule when n_rec recurrent layers run there,
// the output matrix (when `output`) at n_out_max columns and the selection of each row's n_top
// largest logits. At least 64 bytes.
size_t step_workspace(const backend::WorkspaceSizes& ws, const ModelConfig& c, std::span<const MatShape> mats,
                      int64_t n_rec, const MatShape* output, int64_t n_batch, int64_t n_out_max, int delta_chunk_min,
                      int n_top = 0);

// Attention's workspace at n_batch tokens over caches of n_ctx positions (0 without attention layers).
size_t attention_step_workspace(const backend::WorkspaceSizes& ws, const ModelConfig& c, int64_t n_batch,
                                int64_t n_ctx, bool flash_attn);

}  // namespace kiln::model
