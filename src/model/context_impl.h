// model/context_impl.h — internal to src/model: Context::Impl (per-device streams, Arenas and
//   activation views, the per-batch host state), shared by context.cpp (the trunk's step) and
//   mtp.cpp (the MTP block's catch-up rows and drafts). Not included outside src/model.
// Threading: as Context (one thread at a time).
#pragma once
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "model/blocks.h"
#include "model/scratch.h"

namespace kiln::model {

constexpr int64_t kGraphMaxTokens = 64;  // steps of at most this many tokens are recorded as graphs

struct Run {  // validation only: consecutive tokens of one sequence
  int32_t seq = 0;
  int64_t t0 = 0, n = 0;
  int32_t pos0 = 0;
};

using Plan = ScratchPlan;

struct Context::Impl {
  struct Dev {
    backend::Device* dev = nullptr;  // the host: Impl::host
    std::unique_ptr<backend::Stream> st;
    backend::Arena arena;
    Plan plan;
    bool layers = false, output = false;
    // ContextOptions::mtp: the block's inputs are here (the host gathers its token embeddings; the
    // device of Impl::mtp_dev runs the block).
    bool mtp = false;
    bool experts = false;  // runs the routed experts of blocks on another device (their weights are here)
    size_t ws = 0;  // workspace reserved
    // Views for the current batch.
    Act a;
    Tensor tok;                   // I32 [T] (host only)
    Tensor out_idx;               // I32 [n_out]: batch index of each output row
    Tensor hidden;                // [E, n_out]
    Tensor logits;                // [V, n_out]
    Tensor top_ids, top_vals;     // I32 / F32 [n_top, n_out] (ContextOptions::n_top)
    // MTP (model/mtp.cpp): the step's token embeddings, the trunk's normed hidden states, each
    // token's previous hidden state (+ a scratch column), the eh_proj input, and I32 [T] indices.
    Tensor emb, hall, hprev, cat, hidx, hsrc, hshift, hdst, hzero, hring;  // hidx: the five [T] views' region
    Tensor dids, dprob;  // draft steps: I32 [1, n_out] argmax and F32 [1, n_out] its probability
  };

  const Model& m;
  const ModelConfig& c;
  const ContextOptions& opt;
  int64_t n_out_max = 0;
  std::unique_ptr<backend::Device> host;  // on the Context's pool
  std::vector<Dev> devs;                  // [0]: the host
  std::vector<int> layer_dev;             // [n_layer]: index into devs
  std::vector<int> expert_dev;            // [n_layer + n_nextn]: where each block's expert weights are (devs)
  int out_dev = 0;
  int mtp_dev = 0;  // ContextOptions::mtp: where the MTP blocks run (Model::mtp_device)
  bool graph_step = false;  // every layer, its experts and the output on devs[1]
  // (T, n_out = T, mrope, Batch::mtp_defer) -> step
  std::map<std::tuple<int64_t, int64_t, bool, bool>, std::unique_ptr<backend::Graph>> graphs;
  uint64_t graph_mem = 0;  // Memory::id of the Memory the graphs write (an address can be reused)
  bool graphs_unsupported = false;
  int64_t n_kv_reserved = 0;

  // Per-batch host state.
  std::vector<Run> runs;
  std::vector<int32_t> tok_ids;   // Batch::token with image tokens' ids replaced by 0
  std::vector<int32_t> mpos;      // [4, T] M-RoPE streams from Batch::mpos
  std::vector<int32_t> out_idx;
  std::vector<int32_t> rseq, keep;          // hybrid: per token, Memory::rec_slot / rec_keep_slot (-1)
  // Host rows the output device's results land in (Device::alloc_host: page-locked for a GPU).
  std::unique_ptr<backend::Buffer> logits_host, embd_host;
  float* logits = nullptr;  // [V, n_out_max] in logits_host
  size_t logits_n = 0;
  float* embd = nullptr;    // [E, n_out_max] in embd_host, with ContextOptions::embeddings
  std::unique_ptr<backend::Buffer> logits_buf;  // host: a wrap of `logits` (the output matmul writes there)
  // ContextOptions::n_top (capped at the vocabulary): the rows' top logits on the host (page-locked
  // when the output is on a GPU: top_host; else the output's Arena), and which logits rows the host
  // has (all when the output is the host's or n_top is off; else the rows logits() fetched).
  int n_top = 0;
  std::unique_ptr<backend::Buffer> top_host;
  int32_t* top_ids = nullptr;
  float* top_vals = nullptr;
  bool top_valid = false, rows_on_host = true;
  std::vector<uint8_t> fetched;  // [n_out_max]
  // MTP: per token (mtp.cpp), [5, T] as Dev::hidx lays them out: hsrc | hshift | hdst | hzero | hring.
  std::vector<int32_t> hidx;
  bool mtp_defer = false;                                 // this decode's Batch::mtp_defer
  // MTP drafts as one graph (mtp.cpp, graph_step only): every position of n rows recorded once per
  // (n, k); between positions a host node gathers the drafted tokens' embeddings (the table stays
  // on the host). Page-locked: the drafted ids and probabilities [k, n], the gathered rows [E, n].
  struct DraftGather {  // one host node's work: ids[n] -> rows of `table` as F32 into emb [E, n]
    const char* table = nullptr;
    size_t row_bytes = 0;
    gguf::GgmlType type{};
    const int32_t* ids = nullptr;
    float* emb = nullptr;
    int64_t n = 0, E = 0;
    static void run(void* self);
  };
  struct DraftGraph {
    std::unique_ptr<backend::Graph> graph;
    std::vector<DraftGather> gathers;  // [k - 1], pointed at by the graph's host nodes
  };
  std::unique_ptr<backend::Buffer> draft_host;
  int32_t* draft_ids = nullptr;  // [kDraftGraphMax, n_out_max]
  float* draft_p = nullptr;      // [kDraftGraphMax, n_out_max]
  float* draft_emb = nullptr;    // [E, n_out_max]
  std::map<std::pair<int64_t, int>, std::unique_ptr<DraftGraph>> draft_graphs;  // (n, k)
  uint64_t draft_graph_mem = 0;

  Impl(const Model& model, ThreadPool& pool, const ContextOptions& o);
  int dev_index(backend::Device& d);
  void plan(Dev& d);
  void reserve(Dev& d);
  void bind(Dev& d, int64_t T, int64_t n_out);
  bool fused_with_next(int64_t il) const;
  void run_layer(Dev& d, int64_t il, Memory& mem, int64_t T);
  // The device holding block il's expert weights (il >= n_layer: the MTP blocks, with ContextOptions::mtp).
  Dev& experts_of(int64_t il) { return devs[size_t(expert_dev[size_t(il)])]; }
  void run_output(Dev& d, int64_t T, int64_t n_out);
  void move_x(Dev& from, Dev& to, int64_t T);
  bool runs_mtp(const Dev& d) const { return opt.mtp && &d == &devs[size_t(mtp_dev)]; }
  // MTP (mtp.cpp): the per-token indices of a batch (host), and the catch-up rows on the MTP block's
  // device after the trunk (x there: the residual stream).
  Status mtp_prepare(const Batch& b, const Memory& mem);
  void reserve_attention(const Memory& mem);  // attention workspaces for mem's context length
  void mtp_catchup(Dev& d, Memory& mem, int64_t T);  // the block skipped with mtp_defer (the ring still written)
  // The block over T rows op by op (mtp.cpp: the drafts' positions, the deferred catch-up's flush).
  void mtp_rows(Memory& mem, int64_t T, int64_t n_out, const int32_t* ids, const int32_t* pos, const int32_t* seq,
                const int32_t* src, const Tensor& hs);
  // Greedy drafts of k positions for the rows `act` of `rows` as one recorded graph (mtp_draft's path
  // when the whole step is on one GPU and nothing but the drafted ids is wanted).
  void mtp_draft_graph(std::span<const Context::MtpRow> rows, const std::vector<int>& act, int k, float p_min,
                       Memory& mem, std::vector<std::vector<int32_t>>& out);
};

}  // namespace kiln::model
