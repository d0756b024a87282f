// model/memory.h — sequence memory: per sequence slot, the KV cache of every attention layer
//   (F32/F16/Q8_0/Q4_0) and the recurrent state of every delta-net layer (conv state + F32 SSM
//   state); snapshot/restore of one sequence's complete state at its current position; copy
//   between sequences.
// Lives in model/ (not engine/) because the forward pass writes it and model must not depend on
//   engine; the engine owns Memory objects and decides which sequence uses which slot.
// Layout: each layer's state is one Buffer on the device that layer runs on (Model::layer_device;
//   the host for create(config)), seen as 4-D backend Tensors whose ne[3] is the slot: K and V
//   [head_dim, n_head_kv, n_ctx, n_seq] per attention layer; conv [d_conv-1, conv_dim, 1, n_seq] and
//   SSM [S, S, Hv, n_seq * (1 + n_spec)] per recurrent layer. Every move of state (clear, copy, snapshot, restore,
//   the runner's read/write of rows) goes through a Stream of that device: device copies when source
//   and destination are both there, no host round trip; snapshots are host bytes.
// Owns: all cache memory, allocated (and zeroed) once in create() (sized from n_ctx and n_seq); one
//   Stream per device used, for the copies; nothing is allocated afterwards except by snapshot()
//   (which the caller asks for explicitly).
// Speculative rollback (MemoryOptions::n_spec > 0): each sequence owns 1 + n_spec recurrent state
//   slots: its current one (rec_slot) and n_spec keep slots. A verify run asks (Batch::keep) for the
//   state after each of its first tokens to be kept; seq_accept(seq, n, i) then makes keep slot i the
//   current one by swapping slot indices (no state is copied) and truncates the attention KV to n.
// MTP (MemoryOptions::mtp, --spec-type draft-mtp): the model's MTP block is one more attention
//   layer (index n_layer: its KV, read/written/snapshotted/copied with the trunk's) and each recurrent
//   state slot also holds the trunk's hidden state (after the output norm) of the sequence's last
//   token, which the MTP pairs with the next token (mtp_h: [E, n_slots + 1 + n_seq * kMtpRing]: a column
//   per slot, then a scratch column the forward pass writes rows it does not keep to, then the rings). It moves with the recurrent state
//   (read_rec/write_rec/snapshots: rec_floats() counts its E floats; seq_accept's slot swap).
//   Deferred catch-up (Batch::mtp_defer): mtp_h also holds a ring of the last kMtpRing hidden states
//   per sequence (columns mtp_ring_col(seq, pos)), written by every decode, so that the MTP rows of
//   positions whose catch-up a decode skipped can be computed later in one pass (Context::mtp_flush);
//   mtp_done(seq) is the first position without its MTP row (host bookkeeping: seq_clear / seq_keep /
//   seq_accept / seq_copy / restore / set_seq_pos keep it; the ring moves with seq_copy).
// Must not: know about tokens, requests or scheduling; run kernels other than copies.
// Threading: one thread at a time (the one running Context::decode on it). Every method has
//   synchronized its streams when it returns.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "gguf/types.h"
#include "model/config.h"

namespace kiln::model {

using gguf::GgmlType;
class Model;

struct MemoryOptions {
  int64_t n_ctx = 4096;                 // positions per sequence (KV rows per attention layer)
  int n_seq = 1;                        // sequence slots
  GgmlType type_k = GgmlType::F16;      // -ctk: F32, F16, Q8_0, Q4_0
  GgmlType type_v = GgmlType::F16;      // -ctv: F32, F16, Q8_0, Q4_0
  int n_spec = 0;                       // extra recurrent state slots per sequence (speculative verify:
                                        // the most tokens of a verify run whose state is kept)
  bool mtp = false;                     // the MTP block's KV layer and per-slot hidden state (qwen35*
                                        // with nextn_predict_layers >= 1)
  int n_rec_cache = 0;                  // spare recurrent state slots (models with recurrent layers): the
                                        // prefix cache's states kept where the layers run (rec_save / rec_load)
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

// The sizes create() allocates, from the config and options alone (the memory planner, model/fit.h,
// counts with the same function): each attention layer's buffer holds K then V (at a 256-byte
// boundary), each recurrent layer's the conv state then the SSM state.
struct MemoryLayout {
  size_t k_row = 0, v_row = 0;           // bytes of one head row of K / V
  size_t attn_layer_bytes = 0;           // one attention layer's buffer (all slots)
  size_t rec_layer_bytes = 0;            // one recurrent layer's buffer (all slots, keep slots included)
  size_t kv_bytes_per_pos = 0;           // K + V payload of one position of one sequence, all attention layers
  size_t conv_floats = 0, ssm_floats = 0;  // one sequence's recurrent state per recurrent layer
  int64_t n_attn = 0, n_rec = 0;         // layers of each kind (n_attn counts the MTP layer)
  size_t mtp_h_bytes = 0;                // MemoryOptions::mtp: the per-slot hidden states, a scratch column and
                                         // the deferred catch-up's rings [E, n_slots + 1 + n_seq * kMtpRing]
  size_t total() const { return size_t(n_attn) * attn_layer_bytes + size_t(n_rec) * rec_layer_bytes + mtp_h_bytes; }
  // Floats of one sequence's state as Memory::read_rec copies it (Memory::rec_floats()): every recurrent
  // layer's conv and SSM state, then with MTP the slot's hidden state (n_embd floats).
  size_t state_floats(bool mtp, int64_t n_embd) const {
    return size_t(n_rec) * (conv_floats + ssm_floats) + (mtp ? size_t(n_embd) : 0);
  }
};

class Memory {
 public:
  // The layout create() uses; errors (cache type unsupported, head_dim not a multiple of the block
  // size, sizes) name the option.
  static Result<MemoryLayout> layout(const ModelConfig& cfg, const MemoryOptions& opt);
  // Every layer's state on the host. Errors (cache type unsupported, head_dim not a multiple of the
  // block size, sizes) name the option.
  static Result<std::unique_ptr<Memory>> create(const ModelConfig& cfg, const MemoryOptions& opt);
  // Each layer's state on the device the model runs that layer on (the MTP layer: the output's).
  static Result<std::unique_ptr<Memory>> create(const Model& m, const MemoryOptions& opt);
  ~Memory();

  const MemoryOptions& options() const { return opt_; }
  // Unique per Memory created in this process (never reused, unlike an address): what a Context's
  // recorded GPU graphs, which hold this Memory's buffer addresses, are valid for.
  uint64_t id() const { return id_; }
  int64_t n_ctx() const { return opt_.n_ctx; }
  int n_seq() const { return opt_.n_seq; }
  int n_spec() const { return opt_.n_spec; }
  bool has_recurrent() const { return !rec_layers_.empty(); }
  bool has_mtp() const { return opt_.mtp; }
  size_t total_bytes() const { return total_bytes_; }  // state payload (K, V, conv, SSM tensors)
  // Bytes of the layers' Buffers on device `dev` (the host when nullptr): what create() allocated there.
  size_t allocated_bytes(const backend::Device* dev = nullptr) const;

  // Number of positions stored for sequence `seq` (the next token's position).
  int64_t seq_pos(int seq) const;
  // Forget everything of `seq` (position 0, zero recurrent state).
  void seq_clear(int seq);
  // Keep positions [0, n_pos). Attention-only models: any n_pos <= seq_pos. With recurrent layers the
  // state cannot be rolled back: only n_pos == seq_pos (or 0) is allowed; use snapshots instead.
  Status seq_keep(int seq, int64_t n_pos);
  // After a speculative verify run: keep positions [0, n_pos) (attention: the valid length; n_pos <=
  // seq_pos) and make the recurrent state the one kept after the run's token `kept` (its index in the
  // run, < n_spec; the slot indices are swapped, nothing is copied); kept = -1: the run's own final
  // state stays (every token accepted). n_pos is the caller's: the position after that token.
  Status seq_accept(int seq, int64_t n_pos, int kept);
  // The recurrent state slot (index into ne[3] of conv_state / ssm_state) sequence seq uses now, and
  // the one that receives the state after token i (< n_spec) of its verify run.
  int rec_slot(int seq) const;
  int rec_keep_slot(int seq, int i) const;
  // dst := src (KV rows [0, seq_pos(src)) and recurrent state).
  void seq_copy(int src, int dst);
  // Spare recurrent state slots (MemoryOptions::n_rec_cache; 0 without recurrent layers): the
  // recurrent state of `seq` (with MTP its hidden state too) into spare slot i, back from it into a
  // sequence (positions unchanged: the caller sets them), or to the host (rec_floats() floats).
  // Device copies where the layers run: no host round trip.
  int n_rec_cache() const { return has_recurrent() ? opt_.n_rec_cache : 0; }
  void rec_save(int seq, int i);
  void rec_load(int i, int seq);
  void read_rec_cache(int i, float* out) const;
  Snapshot snapshot(int seq) const;
  Status restore(int seq, const Snapshot& s);

  // ---- for the forward pass ----
  // Attention layer `il` (trunk index): K / V caches [head_dim, n_head_kv, n_ctx, n_seq].
  const backend::Tensor& k_cache(int64_t il) const;
  const backend::Tensor& v_cache(int64_t il) const;
  // Recurrent layer `il`: conv state [d_conv-1, conv_dim, 1, n_slots] (row c = channel c), SSM state
  // [S, S, Hv, n_slots], F32; n_slots = n_seq * (1 + n_spec), sequence seq's state at rec_slot(seq).
  const backend::Tensor& conv_state(int64_t il) const;
  const backend::Tensor& ssm_state(int64_t il) const;
  // MTP: the hidden states [E, n_slots + 1 + n_seq * kMtpRing] F32 (column rec_slot(seq): the trunk's
  // normed hidden state of seq's last token; then the scratch column; then the rings), on layer_device(n_layer).
  const backend::Tensor& mtp_h() const { return mtp_h_; }
  int mtp_h_scratch() const { return mtp_scratch_; }
  // Deferred MTP catch-up: ring column of the hidden state of seq's token at pos (in mtp_h), and the
  // first position whose MTP KV row is not computed yet (== seq_pos when nothing is deferred).
  static constexpr int kMtpRing = 64;
  int mtp_ring_col(int seq, int64_t pos) const { return mtp_scratch_ + 1 + seq * kMtpRing + int(pos % kMtpRing); }
  int64_t mtp_done(int seq) const { return mtp_done_[size_t(seq)]; }
  // The device holding layer il's state (il = n_layer: the MTP layer).
  backend::Device& layer_device(int64_t il) const;
  // The caller wrote every row of [0, n) and the recurrent state (the prefix cache, a slot file): with
  // MTP its rows count as complete and the stored hidden state also becomes the ring's column of n - 1.
  void set_seq_pos(int seq, int64_t n);
  // The forward pass: n positions, the MTP rows of [0, mtp_done) computed.
  void set_decoded(int seq, int64_t n, int64_t mtp_done) { pos_[size_t(seq)] = n, mtp_done_[size_t(seq)] = mtp_done; }

  // ---- one sequence's state in pieces (engine::ModelRunner, the prefix cache) ----
  const std::vector<int64_t>& attn_layers() const { return attn_layers_; }  // trunk indices, ascending
  size_t k_pos_stride() const { return k_row_ * size_t(n_head_kv_); }  // bytes of one position's K row
  size_t v_pos_stride() const { return v_row_ * size_t(n_head_kv_); }
  // KV payload of n positions: per attention layer, K rows [n, k_pos_stride] then V rows.
  size_t kv_bytes_per_pos() const { return attn_layers_.size() * (k_pos_stride() + v_pos_stride()); }
  void read_kv(int seq, int64_t pos0, int64_t n, uint8_t* out) const;
  // Writes rows [r0, r1) of a payload of `rows` positions that starts at position pos0.
  void write_kv(int seq, int64_t pos0, const uint8_t* payload, int64_t rows, int64_t r0, int64_t r1);
  // The recurrent state of one sequence, all recurrent layers (each: conv state then SSM state):
  // rec_floats() floats (0 without recurrent layers), then with MTP the slot's hidden state (E floats).
  size_t rec_floats() const { return rec_floats_; }
  void read_rec(int seq, float* out) const;
  void write_rec(int seq, const float* in);

 private:
  uint64_t id_ = 0;
  struct Layer {  // one layer's state: a, b = K, V (attention) or conv, SSM (recurrent)
    backend::Device* dev = nullptr;
    backend::Stream* st = nullptr;  // of dev, owned by streams_
    std::unique_ptr<backend::Buffer> buf;
    backend::Tensor a, b;
  };
  Memory() = default;
  static Result<std::unique_ptr<Memory>> create(const ModelConfig& cfg, const MemoryOptions& opt,
                                                const std::vector<backend::Device*>& devs);
  // Contiguous view of positions [p0, p0 + n) of slot seq of a K/V cache.
  static backend::Tensor kv_rows(const backend::Tensor& cache, int seq, int64_t p0, int64_t n);
  static backend::Tensor slot(const backend::Tensor& state, int seq);  // contiguous view of one slot
  backend::Tensor mtp_col(int slot) const;                              // column of mtp_h_
  backend::Tensor mtp_ring(int seq) const;                              // seq's ring columns of mtp_h_
  void sync() const;
  int cache_slot(int i) const;  // physical slot of spare slot i
  void copy_rec(int dst_phys, int src_phys);
  void read_rec_phys(int phys, float* out) const;

  MemoryOptions opt_;
  int64_t n_head_kv_ = 0;
  size_t k_row_ = 0, v_row_ = 0;         // bytes of one head row
  size_t conv_floats_ = 0, ssm_floats_ = 0;
  size_t rec_floats_ = 0;  // MemoryLayout::state_floats
  size_t total_bytes_ = 0;
  std::vector<int64_t> attn_layers_, rec_layers_;
  std::unique_ptr<backend::Device> host_;  // for host layers (created lazily in create())
  std::vector<std::pair<backend::Device*, std::unique_ptr<backend::Stream>>> streams_;
  std::vector<Layer> layers_;              // [n_layer (+ 1 with MTP)] (empty dev for none)
  int64_t n_embd_ = 0;
  backend::Device* rec_stage_dev_ = nullptr;  // a GPU holding recurrent layers (none: no staging)
  mutable std::unique_ptr<backend::Buffer> rec_stage_;  // page-locked rec_floats() floats, made by rec_stage()
  float* rec_stage() const;
  std::unique_ptr<backend::Buffer> mtp_buf_;  // MTP: mtp_h_ on layers_[n_layer]'s device
  backend::Tensor mtp_h_;
  int mtp_scratch_ = 0;                // mtp_h_'s scratch column (after the recurrent slots; the rings follow)
  std::vector<int64_t> pos_, mtp_done_;
  std::vector<std::vector<int>> rec_phys_;  // [n_seq][1 + n_spec]: [0] the current slot, then the keep slots
};

}  // namespace kiln::model
