// engine/prefix_cache.h — prefix cache across requests and slots: a radix tree over token blocks
//   (B tokens each) whose nodes hold the KV rows of their block (opaque bytes from the Runner) and,
//   for hybrid models, the recurrent state at chosen block ends; plus "tails": a partial block
//   (< B tokens) hanging off a node with its KV rows and the recurrent state at its end (the end of
//   a prompt or of a generated answer, which is rarely block-aligned). RAM-bounded, LRU eviction.
//   Recurrent states have two tiers: spare state slots where the model's layers run (the Runner's,
//   PrefixCacheOptions::n_dev_states: a state is saved and restored by device copies) and host RAM;
//   a new state takes a free slot, else the least recently used slot's state moves to RAM.
// Owns: copies of KV rows and host-tier recurrent states (host RAM), which spare slot holds which
//   state, the LRU clock and byte accounting (host bytes only: the slots are the Memory's).
// Must not: know about models, requests or slots; it stores and returns plain bytes/floats.
// Threading: engine thread only. A Match points into the cache and is valid until the next
//   insert()/clear().
//
// Payload layout (decided by the Runner, opaque here): the KV payload of n consecutive positions is
// Runner::kv_bytes(n) bytes; positions are rows. The recurrent payload is rec_floats floats.
//
// Matching rule: the reusable length is the largest L <= max_len such that
//   attention-only: the first L tokens are covered by matched blocks, then the common beginning of
//     a child block or of a tail (partial rows are fine: a KV row depends only on earlier tokens);
//   hybrid (recurrent): a recurrent state exists at exactly position L (a node or a whole tail).
// NOTE(engine): the root (L = 0) is always a valid match: a zero state needs no snapshot.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::engine {

// Allocation of host-tier recurrent states: buffers of 2 MiB and more are 2 MiB-aligned and advised to
// transparent huge pages (a 9B's 53 MB state then faults ~27 times instead of ~13,000: 25 ms of page faults
// on the engine thread per new state), and elements are default-initialised (a state is written whole
// before it is read), so a new buffer is not zeroed first.
void* state_alloc(size_t bytes);
void state_free(void* p) noexcept;
template <class T>
struct StateAllocator {
  using value_type = T;
  StateAllocator() = default;
  template <class U>
  StateAllocator(const StateAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(state_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { state_free(p); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const StateAllocator<U>&) const noexcept { return true; }
};
using StateFloats = std::vector<float, StateAllocator<float>>;

struct PrefixCacheOptions {
  int32_t block = 32;          // tokens per block
  int64_t ram_bytes = -1;      // < 0: unlimited, 0: disabled
  bool recurrent = false;      // hybrid model: a match needs a recurrent state at its end
  size_t kv_bytes_per_pos = 0; // KV payload bytes of one position (0: no attention layers)
  size_t rec_floats = 0;       // recurrent payload floats (0 when !recurrent)
  // The first tier (recurrent): spare state slots 0 .. n_dev_states - 1, and how to read slot i's
  // state to the host (rec_floats floats) when it moves to RAM. 0: every state in RAM.
  int n_dev_states = 0;
  std::function<void(int slot, float* out)> read_dev;
};

struct PrefixCacheStats {
  int64_t n_nodes = 0;      // full blocks held
  int64_t n_tails = 0;      // partial-block entries held
  int64_t n_states = 0;     // recurrent states held (nodes + tails)
  int64_t n_dev_states = 0; // of which in spare state slots (the first tier)
  int64_t bytes = 0;        // bytes accounted (payloads + bookkeeping)
  int64_t evictions = 0;    // entries evicted so far
};

class PrefixCache {
 public:
  explicit PrefixCache(const PrefixCacheOptions& opt);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  const PrefixCacheOptions& options() const { return opt_; }
  bool enabled() const { return opt_.ram_bytes != 0; }

  // KV rows of positions [pos0, pos0 + rows) as stored (rows of one block or one tail).
  struct Piece {
    int64_t pos0 = 0;
    int64_t rows = 0;
    const uint8_t* kv = nullptr;  // kv_bytes(rows) bytes, nullptr when there are no attention layers
  };
  struct Match {
    int64_t n_tokens = 0;             // reusable prefix length
    std::vector<Piece> pieces;        // covering [0, n_tokens) in order (the last may extend past it)
    const float* rec = nullptr;       // recurrent state at n_tokens in RAM (hybrid; nullptr at 0 or in a slot)
    int rec_dev = -1;                 // ... or the spare state slot holding it
  };
  // Longest reusable prefix of `tokens`, at most max_len. Marks what it returns as recently used.
  Match match(std::span<const int32_t> tokens, int64_t max_len);

  // Longest prefix of `tokens` held as token blocks and tails, whether or not a recurrent state is
  // stored at its end (hybrid models: the point where a prompt leaves what is cached, where a snapshot
  // lets later prompts sharing that prefix resume). Does not touch recency.
  int64_t shared_prefix(std::span<const int32_t> tokens) const;

  // Reads KV rows [pos0, pos0 + n) of the sequence into out (kv_bytes(n) bytes).
  using KvReader = std::function<void(int64_t pos0, int64_t n, uint8_t* out)>;
  // The sequence's recurrent state: `read` copies it to the host (rec_floats floats), `save` into
  // spare state slot i. Called only when the cache keeps a state it does not hold yet.
  struct StateSource {
    std::function<void(float* out)> read;
    std::function<void(int slot)> save;
  };
  // Records the sequence `tokens` (its KV available through read_kv): every full block not yet held;
  // if rec != nullptr, the recurrent state at tokens.size() (on the node when block-aligned, else as a
  // tail); if with_tail and the length is not block-aligned, the partial block's KV as a tail.
  // Then evicts least-recently-used entries until the byte bound holds.
  void insert(std::span<const int32_t> tokens, const KvReader& read_kv, const StateSource* rec, bool with_tail);

  void clear();
  PrefixCacheStats stats() const;  // walks the tree: O(entries)
  uint64_t version() const { return version_; }  // changes on every insert/eviction/clear
  size_t kv_bytes(int64_t rows) const { return size_t(rows) * opt_.kv_bytes_per_pos; }

  struct Node;
  struct Tail;
  struct State {  // a recurrent state: in spare slot `dev`, or host floats, or none
    int dev = -1;
    StateFloats host;
    bool empty() const { return dev < 0 && host.empty(); }
  };

 private:
  void store_state(State& st, const StateSource& src);
  void release_state(State& st);
  int take_dev_slot();  // a free spare slot, else the least recently used one's state moved to RAM
  void touch(Node* n);
  void evict_to_bound();
  void remove_node(Node* n);
  void prune_dead(Node* n);  // hybrid: drop leaves whose KV no snapshot needs
  int64_t node_bytes(const Node& n) const;
  int64_t tail_bytes(const Tail& t) const;

  PrefixCacheOptions opt_;
  std::unique_ptr<Node> root_;
  std::vector<Node*> nodes_;  // every node except the root (for eviction scans)
  uint64_t clock_ = 0;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  uint64_t version_ = 0;
  std::vector<int> free_dev_;  // spare state slots holding nothing
  // Host buffers of released states (at most kSpareHost), reused by the next state that moves to RAM: a
  // busy server evicts one RAM state for each it adds, and a fresh 53 MB (9B) buffer costs its page faults.
  static constexpr size_t kSpareHost = 2;
  std::vector<StateFloats> spare_host_;
  void take_host(State& st);
};

}  // namespace kiln::engine
