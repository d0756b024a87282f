// model/context.h — running a Model: Batch (tokens of one or more sequences) and Context (thread
//   pool, one Stream and one scratch Arena per device the model runs on, planned once for a maximum
//   batch size, output logits) whose decode() runs the forward pass of the model's architecture and
//   writes the sequences' Memory.
// Owns: the host device (on its ThreadPool) and a Stream per device used (host always; the GPU when
//   layers are placed there); scratch Arenas; the logits of the last decode(); recorded step Graphs.
// Placement: each layer runs on its device's stream (Model::layer_device); the residual stream moves
//   across a device boundary once (download + synchronize + upload). When every layer and the output
//   are on one non-host device, the step (layers + output) is recorded as a Graph per (T, n_outputs)
//   the first time and replayed afterwards.
// Must not: allocate in decode() (all scratch is sized in the constructor for n_batch tokens; only
//   the first step of a new (T, n_outputs) on a GPU records a graph); sample, tokenize or see
//   requests.
// Batch rules: a batch holds one or more runs; a run is consecutive tokens of ONE sequence at
//   consecutive positions pos0, pos0+1, ... (a prefill chunk or a single decode token). Every run
//   must start at the sequence's current position in Memory (seq_pos); attention-only models may
//   also start earlier (the rows after pos0 are overwritten: a rollback). A sequence appears in at
//   most one run per batch. Runs may mix prefill chunks and decode tokens of different sequences.
//   Speculative verification: a token with keep = 1 has the recurrent state after it kept (its index
//   in its run must be < MemoryOptions::n_spec); Memory::seq_accept then rolls the sequence back.
// Threading: a Context is used by one thread at a time; several Contexts may share one Model.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "model/memory.h"
#include "model/model.h"

namespace kiln::model {

struct Batch {
  std::vector<int32_t> token;
  std::vector<int32_t> pos;
  std::vector<int32_t> seq;
  std::vector<uint8_t> output;  // 1: compute this token's logits
  std::vector<uint8_t> keep;    // 1: keep the recurrent state after this token (Memory::rec_keep_slot)
  // Images (vision, --mmproj): empty, or one entry per token: nullptr = the token's own embedding,
  // else n_embd floats used instead (an image token; its id is then not looked up and may be any
  // value). The pointed-to floats must stay valid until decode() returns.
  std::vector<const float*> embd;
  // M-RoPE positions (models with rope sections, qwen35*): empty (every section at `pos`), or 3 per
  // token (t, h, w) at mpos[3*i..]: image tokens at (p0, p0 + y, p0 + x), text after an image at
  // positions that advance by max(nx, ny) per image (llama.cpp's mtmd). `pos` stays the KV row.
  std::vector<int32_t> mpos;
  // ContextOptions::mtp: skip the MTP block's catch-up rows of this batch's tokens (their trunk hidden
  // states still go to the Memory's ring); they stay pending (Memory::mtp_done) until mtp_flush(), which
  // must come before a sequence has Memory::kMtpRing positions pending, before it drafts and before its
  // rows are read out (snapshots, the prefix cache). The engine sets it while every slot's drafting is paused.
  bool mtp_defer = false;
  void clear() {
    token.clear(); pos.clear(); seq.clear(); output.clear(); keep.clear(); embd.clear(); mpos.clear();
    mtp_defer = false;
  }
  void add(int32_t tok, int32_t p, int32_t s, bool out, bool kp = false) {
    token.push_back(tok); pos.push_back(p); seq.push_back(s); output.push_back(out ? 1 : 0); keep.push_back(kp ? 1 : 0);
  }
  // Appends a run of tokens of sequence s starting at pos0; logits for all tokens or just the last.
  void add_run(std::span<const int32_t> toks, int32_t pos0, int32_t s, bool all_logits, bool last_logits = true) {
    for (size_t i = 0; i < toks.size(); ++i)
      add(toks[i], pos0 + int32_t(i), s, all_logits || (last_logits && i + 1 == toks.size()));
  }
  int64_t size() const { return int64_t(token.size()); }
};

struct ContextOptions {
  int64_t n_batch = 512;   // most tokens one decode() may take
  int n_threads = 0;       // <= 0: all cores (or KILN_THREADS)
  // Gated-delta prefill: runs of at least this many tokens use the chunked form (0 = never).
  int delta_chunk_min = 0;
  // Most tokens with output=1 per decode() (0 = n_batch). The logits buffer is n_vocab x this
  // (a 248k vocabulary x 512 is 0.5 GB, so servers that need only last-token logits set it low).
  int64_t n_outputs_max = 0;
  // false: attention as llama.cpp computes it without flash attention (`-fa off`): ggml's
  // mul_mat / soft_max graph operation for operation, bit-identical to llama.cpp's CPU backend on
  // AVX-512 hosts with an F16 cache; its sums depend on how many tokens a sequence brings to a
  // batch (ggml's own rule), so results are not batch-invariant. true (default): kiln's streaming
  // softmax, batch- and chunk-invariant.
  bool flash_attn = true;
  // Each token's results independent of the batch and of how a prompt is split, on every device
  // (backend::Stream::set_batch_invariant; the CPU's kernels are so already with flash_attn; on CUDA
  // per-token kernels, process-wide once one Context asks for them).
  bool batch_invariant = false;
  // Also keep each output row's hidden state after the output norm (the embedding llama.cpp pools):
  // n_embd x n_outputs_max floats of host memory, one more download per step on a GPU.
  bool embeddings = false;
  // Run the model's MTP block (qwen35*: Model::mtp, --spec-type draft-mtp; model/mtp.cpp): every
  // decode also computes the block's KV rows of its tokens (the Memory needs MemoryOptions::mtp),
  // and mtp_draft() drafts with it. The block runs on the last trunk layer's device (Model::mtp_device).
  bool mtp = false;
  // mtp_draft() without keep_logits: the drafts' head is the first mtp_draft_vocab rows of the
  // output (argmax and probability among those ids; --spec-draft-vocab). 0 or >= n_vocab: all.
  int64_t mtp_draft_vocab = 0;
  // Also select each output row's n_top largest logits where the logits are (0 = off; at most 128,
  // capped at n_vocab): top_logits(). On a GPU a decode then downloads only those (k ids and values
  // per row instead of the vocabulary), and logits(i) downloads row i when it is first read.
  int n_top = 0;
};

class Context {
 public:
  Context(const Model& model, const ContextOptions& opt);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Model& model() const { return model_; }
  ThreadPool& pool() { return *pool_; }
  int64_t n_batch() const { return opt_.n_batch; }

  // Runs the batch; on success memory's positions are advanced and logits() holds one row per
  // token with output=1, in batch order. Errors: bad token ids, positions or run structure.
  Status decode(const Batch& batch, Memory& mem);

  // What this Context holds per device it runs on ([0]: the host): its scratch Arena's size, the
  // op workspace reserved on its stream (attention's included once decode() has seen a Memory), and
  // on the host the logits buffer (n_vocab x n_outputs_max floats). The memory planner's numbers
  // (model/fit.h) are checked against these.
  struct DeviceUse {
    const backend::Device* device = nullptr;
    size_t arena = 0, workspace = 0, logits = 0;
  };
  std::vector<DeviceUse> memory_use() const;

  int64_t n_outputs() const { return n_out_; }
  // Logits row i (i < n_outputs()): n_vocab floats. With n_top on a GPU, the first read of a row
  // after a decode downloads it (and waits for it).
  const float* logits(int64_t i) const;
  // With ContextOptions::n_top: output row i's n largest logits, descending, ties lower id first
  // (kernels::top_logits), as the last decode() left them. false without n_top, or after mtp_draft.
  struct TopLogits {
    const int32_t* id = nullptr;
    const float* logit = nullptr;
    int n = 0;
  };
  bool top_logits(int64_t i, TopLogits& out) const;
  // With ContextOptions::embeddings: output row i's hidden state after the output norm (n_embd floats).
  bool has_embeddings() const { return opt_.embeddings; }
  const float* embedding(int64_t i) const;

  // MTP drafts (ContextOptions::mtp): for each row, a sequence (its memory as the last decode left
  // it) and the token sampled after it; up to n_max tokens drafted greedily by the MTP block, a row
  // stopping at a token whose probability is below p_min. The block's KV rows past each sequence's
  // position are written (the next decode overwrites them); positions are unchanged. With
  // keep_logits, logits() then holds the last draft step's rows (the rows still drafting then, in
  // row order; a download per step on a GPU), else it is empty. Errors: bad rows, no MTP.
  struct MtpRow {
    int32_t seq = 0, token = 0;
    int n_max = 0;
  };
  Status mtp_draft(std::span<const MtpRow> rows, float p_min, Memory& mem, std::vector<std::vector<int32_t>>& out,
                   bool keep_logits = false);
  // The MTP rows that deferred decodes (Batch::mtp_defer) left pending, for each sequence in seqs, in
  // one batched pass of the block per n_batch tokens: positions [Memory::mtp_done, seq_pos), each token
  // paired with the previous one's hidden state from the Memory's ring. tokens[i]: sequence seqs[i]'s
  // tokens, at least up to its seq_pos (the ids of the pending positions are read there). Afterwards
  // every sequence's MTP rows are exactly those an undeferred decode writes.
  Status mtp_flush(std::span<const int32_t> seqs, std::span<const std::span<const int32_t>> tokens, Memory& mem);

  struct Impl;

 private:
  const Model& model_;
  ContextOptions opt_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Impl> impl_;
  int64_t n_out_ = 0;
};

}  // namespace kiln::model
