// model/memory.h — sequence memory: per sequence slot, the KV cache of every attention layer
//   (F32/F16/Q8_0/Q4_0) and the recurrent state of every delta-net layer (conv state + F32 SSM
//   state); snapshot/restore of one sequence's complete state at its current position; copy
//   between sequences.
// Lives in model/ (not engine/) because the forward pass writes it and model must not depend on
//   engine; the engine owns Memory objects and decides which sequence uses which slot.
// Owns: all cache memory, allocated once in create() (sized from n_ctx and n_seq); nothing is
//   allocated afterwards except by snapshot() (which the caller asks for explicitly).
// Must not: know about tokens, requests or scheduling; run kernels other than copies.
// Threading: one thread at a time (the one running Context::decode on it).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/result.h"
#include "gguf/types.h"
#include "model/config.h"

namespace kiln::model {

using gguf::GgmlType;

struct MemoryOptions {
  int64_t n_ctx = 4096;                 // positions per sequence (KV rows per attention layer)
  int n_seq = 1;                        // sequence slots
  GgmlType type_k = GgmlType::F16;      // -ctk: F32, F16, Q8_0, Q4_0
  GgmlType type_v = GgmlType::F16;      // -ctv: F32, F16, Q8_0, Q4_0
};

// A sequence's complete state at position `n_pos`: the first n_pos KV rows of each attention layer
// and the recurrent states as of that position. Plain bytes; restorable into any slot of a Memory
// with the same layout.
struct Snapshot {
  int64_t n_pos = 0;
  std::vector<uint8_t> kv;     // per attention layer: K rows [0, n_pos) then V rows [0, n_pos)
  std::vector<float> rec;      // per recurrent layer: conv state then SSM state
  size_t bytes() const { return kv.size() + rec.size() * sizeof(float); }
};

class Memory {
 public:
  // Errors (cache type unsupported, head_dim not a multiple of the block size, sizes) name the option.
  static Result<std::unique_ptr<Memory>> create(const ModelConfig& cfg, const MemoryOptions& opt);

  const MemoryOptions& options() const { return opt_; }
  int64_t n_ctx() const { return opt_.n_ctx; }
  int n_seq() const { return opt_.n_seq; }
  bool has_recurrent() const { return !rec_layers_.empty(); }
  size_t total_bytes() const { return kv_.size() + rec_.size() * sizeof(float); }

  // Number of positions stored for sequence `seq` (the next token's position).
  int64_t seq_pos(int seq) const;
  // Forget everything of `seq` (position 0, zero recurrent state).
  void seq_clear(int seq);
  // Keep positions [0, n_pos). Attention-only models: any n_pos <= seq_pos. With recurrent layers the
  // state cannot be rolled back: only n_pos == seq_pos (or 0) is allowed; use snapshots instead.
  Status seq_keep(int seq, int64_t n_pos);
  // dst := src (KV rows [0, seq_pos(src)) and recurrent state).
  void seq_copy(int src, int dst);
  Snapshot snapshot(int seq) const;
  Status restore(int seq, const Snapshot& s);

  // ---- for the forward pass ----
  // Attention layer `il` (trunk index), sequence seq: cache base pointers. Row (pos p, head h) is at
  // base + p*pos_stride + h*head_stride.
  uint8_t* k_data(int64_t il, int seq);
  uint8_t* v_data(int64_t il, int seq);
  size_t k_pos_stride() const { return k_row_ * size_t(n_head_kv_); }
  size_t v_pos_stride() const { return v_row_ * size_t(n_head_kv_); }
  size_t k_head_stride() const { return k_row_; }
  size_t v_head_stride() const { return v_row_; }
  // Recurrent layer `il`: conv state [d_conv-1, conv_dim] (row c = channel c), SSM state [S, S, Hv].
  float* conv_state(int64_t il, int seq);
  float* ssm_state(int64_t il, int seq);
  void set_seq_pos(int seq, int64_t n) { pos_[size_t(seq)] = n; }

  // ---- layout, for copying a sequence's state in pieces (engine::ModelRunner) ----
  const std::vector<int64_t>& attn_layers() const { return attn_layers_; }  // trunk indices, ascending
  // The recurrent state of one sequence, all recurrent layers (each: conv state then SSM state),
  // contiguous at rec_data(seq): rec_floats() floats (0 without recurrent layers).
  size_t rec_floats() const { return rec_layers_.size() * (conv_floats_ + ssm_floats_); }
  float* rec_data(int seq);

 private:
  Memory() = default;
  MemoryOptions opt_;
  int64_t n_head_kv_ = 0;
  size_t k_row_ = 0, v_row_ = 0;         // bytes of one head row
  size_t kv_layer_seq_bytes_ = 0;        // K + V bytes of one layer for one sequence
  size_t conv_floats_ = 0, ssm_floats_ = 0;
  std::vector<int64_t> attn_index_;      // trunk layer -> attention layer index, or -1
  std::vector<int64_t> rec_index_;       // trunk layer -> recurrent layer index, or -1
  std::vector<int64_t> attn_layers_, rec_layers_;
  std::vector<uint8_t> kv_;              // [seq][attn layer][K (n_ctx rows) | V (n_ctx rows)]
  std::vector<float> rec_;               // [seq][rec layer][conv | ssm]
  std::vector<int64_t> pos_;
};

}  // namespace kiln::model
