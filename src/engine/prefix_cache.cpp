#include "engine/prefix_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "core/check.h"

namespace kiln::engine {

void* state_alloc(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < kHuge) {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t n = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, n);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)madvise(p, n, MADV_HUGEPAGE);  // advice only: without transparent huge pages it is 4 KiB pages
#endif
  return p;
}
void state_free(void* p) noexcept { std::free(p); }

namespace {
constexpr int64_t kEntryOverhead = 128;  // bookkeeping bytes accounted per node / tail

std::string block_key(std::span<const int32_t> toks) {
  return std::string(reinterpret_cast<const char*>(toks.data()), toks.size() * sizeof(int32_t));
}
}  // namespace

struct PrefixCache::Tail {
  std::vector<int32_t> tokens;  // 1 .. B-1 tokens after the node
  std::vector<uint8_t> kv;      // KV rows of those tokens
  State rec;                    // recurrent state at the tail's end (hybrid), else empty
  uint64_t last_used = 0;
};

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::string key;              // the block's tokens as bytes (key in parent->children)
  int64_t end = 0;              // position after this block (depth * B)
  std::vector<uint8_t> kv;      // KV rows [end - B, end)
  State rec;                    // recurrent state at `end`, or empty
  std::unordered_map<std::string, std::unique_ptr<Node>> children;
  std::vector<std::unique_ptr<Tail>> tails;
  uint64_t last_used = 0;
  size_t index = 0;             // position in nodes_
  const int32_t* tokens() const { return reinterpret_cast<const int32_t*>(key.data()); }
};

PrefixCache::PrefixCache(const PrefixCacheOptions& opt) : opt_(opt), root_(std::make_unique<Node>()) {
  KILN_CHECK(opt_.block > 0, "prefix cache block size {}", opt_.block);
  KILN_CHECK(!opt_.recurrent || opt_.rec_floats > 0, "recurrent prefix cache needs rec_floats");
  if (!opt_.recurrent) opt_.n_dev_states = 0;
  KILN_CHECK(opt_.n_dev_states == 0 || opt_.read_dev, "prefix cache: spare state slots need read_dev");
  for (int i = opt_.n_dev_states - 1; i >= 0; --i) free_dev_.push_back(i);
}

PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::node_bytes(const Node& n) const {
  return kEntryOverhead + int64_t(n.key.size() + n.kv.size() + n.rec.host.size() * sizeof(float));
}
int64_t PrefixCache::tail_bytes(const Tail& t) const {
  return kEntryOverhead + int64_t(t.tokens.size() * sizeof(int32_t) + t.kv.size() + t.rec.host.size() * sizeof(float));
}

void PrefixCache::touch(Node* n) {
  const uint64_t t = ++clock_;
  for (; n != nullptr; n = n->parent) n->last_used = t;
}

int64_t PrefixCache::shared_prefix(std::span<const int32_t> tokens) const {
  if (!enabled()) return 0;
  const int64_t B = opt_.block, T = int64_t(tokens.size());
  const Node* n = root_.get();
  for (;;) {
    const int64_t pos = n->end;
    auto it = pos + B <= T ? n->children.find(block_key(tokens.subspan(size_t(pos), size_t(B)))) : n->children.end();
    if (it != n->children.end()) {
      n = it->second.get();
      continue;
    }
    // The longest common beginning with a child block or a tail ends the walk.
    int64_t best = 0;
    auto common = [&](const int32_t* t, int64_t len) {
      int64_t c = 0;
      while (c < len && pos + c < T && t[c] == tokens[size_t(pos + c)]) ++c;
      best = std::max(best, c);
    };
    for (const auto& [key, child] : n->children) common(child->tokens(), B);
    for (const auto& t : n->tails) common(t->tokens.data(), int64_t(t->tokens.size()));
    return pos + best;
  }
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens, int64_t max_len) {
  Match best;
  if (!enabled() || max_len <= 0) return best;
  max_len = std::min<int64_t>(max_len, int64_t(tokens.size()));
  const int64_t B = opt_.block;
  Node* best_node = root_.get();
  Tail* best_tail = nullptr;
  int64_t best_len = 0;
  auto consider = [&](int64_t cand, Node* n, Tail* t) {
    if (cand > best_len) {
      best_len = cand;
      best_node = n;
      best_tail = t;
    }
  };

  auto consider_tails = [&](Node* n) {
    const int64_t pos = n->end;
    for (auto& tp : n->tails) {
      const Tail& t = *tp;
      int64_t common = 0;
      while (common < int64_t(t.tokens.size()) && pos + common < int64_t(tokens.size()) &&
             t.tokens[size_t(common)] == tokens[size_t(pos + common)])
        ++common;
      if (!opt_.recurrent) consider(std::min(pos + common, max_len), n, tp.get());
      else if (common == int64_t(t.tokens.size()) && !t.rec.empty() && pos + common <= max_len)
        consider(pos + common, n, tp.get());
    }
  };

  // Attention-only: the child sharing the longest beginning with the rest of the prompt gives that
  // many more rows (a KV row depends only on the tokens before it).
  auto consider_children = [&](Node* n) {
    if (opt_.recurrent) return;
    const int64_t pos = n->end, rest = std::min<int64_t>(B, int64_t(tokens.size()) - pos);
    for (auto& [key, child] : n->children) {
      const int32_t* ct = child->tokens();
      int64_t c = 0;
      while (c < rest && ct[c] == tokens[size_t(pos + c)]) ++c;
      consider(std::min(pos + c, max_len), child.get(), nullptr);
    }
  };

  Node* n = root_.get();
  consider_tails(n);
  for (;;) {
    const int64_t pos = n->end;
    if (!opt_.recurrent && pos >= max_len) break;
    auto it = pos + B <= int64_t(tokens.size()) ? n->children.find(block_key(tokens.subspan(size_t(pos), size_t(B))))
                                                : n->children.end();
    if (it == n->children.end()) {  // no full block left, or none held: partial matches end the walk
      consider_children(n);
      break;
    }
    n = it->second.get();
    if (!opt_.recurrent) consider(std::min(n->end, max_len), n, nullptr);
    else if (!n->rec.empty() && n->end <= max_len) consider(n->end, n, nullptr);
    consider_tails(n);
  }
  if (best_len == 0) return best;

  best.n_tokens = best_len;
  // Pieces: the nodes from the root to best_node (which may extend past best_len for attention-only).
  for (Node* p = best_node; p != root_.get(); p = p->parent)
    best.pieces.push_back({p->end - B, B, p->kv.empty() ? nullptr : p->kv.data()});
  std::reverse(best.pieces.begin(), best.pieces.end());
  if (best_tail) {
    best.pieces.push_back({best_node->end, int64_t(best_tail->tokens.size()),
                           best_tail->kv.empty() ? nullptr : best_tail->kv.data()});
    if (opt_.recurrent) best.rec = best_tail->rec.host.data(), best.rec_dev = best_tail->rec.dev;
    best_tail->last_used = clock_ + 1;
  } else if (opt_.recurrent) {
    best.rec = best_node->rec.host.data(), best.rec_dev = best_node->rec.dev;
  }
  if (best.rec_dev >= 0) best.rec = nullptr;
  touch(best_node);
  return best;
}

void PrefixCache::insert(std::span<const int32_t> tokens, const KvReader& read_kv, const StateSource* rec,
                         bool with_tail) {
  if (!enabled()) return;
  ++version_;
  const int64_t B = opt_.block, n_tok = int64_t(tokens.size());
  Node* n = root_.get();
  for (int64_t pos = 0; pos + B <= n_tok; pos += B) {
    std::string key = block_key(tokens.subspan(size_t(pos), size_t(B)));
    auto it = n->children.find(key);
    if (it == n->children.end()) {
      auto child = std::make_unique<Node>();
      child->parent = n;
      child->key = std::move(key);
      child->end = pos + B;
      if (opt_.kv_bytes_per_pos > 0) {
        child->kv.resize(kv_bytes(B));
        read_kv(pos, B, child->kv.data());
      }
      child->index = nodes_.size();
      nodes_.push_back(child.get());
      bytes_ += node_bytes(*child);
      Node* raw = child.get();
      n->children.emplace(raw->key, std::move(child));
      n = raw;
    } else {
      n = it->second.get();
    }
  }
  const int64_t tail_n = n_tok - n->end;
  const bool aligned = tail_n == 0;
  touch(n);  // before a state is stored: the node is the most recently used (not a spill victim)
  if (rec != nullptr && opt_.recurrent && aligned && n != root_.get() && n->rec.empty())
    store_state(n->rec, *rec);  // (a state already held: the same tokens give the same state)
  if (!aligned && (with_tail || (rec != nullptr && opt_.recurrent))) {
    auto tail = std::make_unique<Tail>();
    tail->tokens.assign(tokens.begin() + n->end, tokens.end());
    // An existing tail with the same tokens (or, attention-only, one this one extends) is replaced.
    for (size_t i = 0; i < n->tails.size(); ++i) {
      const Tail& o = *n->tails[i];
      const bool same = o.tokens == tail->tokens;
      const bool covered = !opt_.recurrent && o.tokens.size() <= tail->tokens.size() &&
                           std::equal(o.tokens.begin(), o.tokens.end(), tail->tokens.begin());
      if (same || covered) {
        bytes_ -= tail_bytes(o);
        release_state(n->tails[i]->rec);
        n->tails.erase(n->tails.begin() + std::ptrdiff_t(i));
        --i;
      }
    }
    if (opt_.kv_bytes_per_pos > 0) {
      tail->kv.resize(kv_bytes(tail_n));
      read_kv(n->end, tail_n, tail->kv.data());
    }
    tail->last_used = clock_;
    if (rec != nullptr && opt_.recurrent) store_state(tail->rec, *rec);  // counts its host bytes
    bytes_ += tail_bytes(*tail) - int64_t(tail->rec.host.size() * sizeof(float));
    n->tails.push_back(std::move(tail));
  }
  evict_to_bound();
}

void PrefixCache::remove_node(Node* n) {
  KILN_CHECK(n != root_.get() && n->children.empty(), "prefix cache: removing a non-leaf node");
  for (auto& t : n->tails) {
    bytes_ -= tail_bytes(*t);
    release_state(t->rec);
  }
  bytes_ -= node_bytes(*n);
  release_state(n->rec);
  Node* last = nodes_.back();
  last->index = n->index;
  nodes_[n->index] = last;
  nodes_.pop_back();
  ++evictions_;
  n->parent->children.erase(n->key);  // destroys n
}

void PrefixCache::prune_dead(Node* n) {
  if (!opt_.recurrent) return;
  while (n != root_.get() && n->children.empty() && n->tails.empty() && n->rec.empty()) {
    Node* p = n->parent;
    remove_node(n);
    n = p;
  }
}

// NOTE(engine): LRU over evictable entries: every tail, and every leaf node without tails. For a
// hybrid model, a leaf node left without a recurrent state (and its ancestors in the same
// situation) is dead weight — its KV can only be used up to a deeper state — and goes with it.
void PrefixCache::evict_to_bound() {
  if (opt_.ram_bytes < 0) return;
  while (bytes_ > opt_.ram_bytes) {
    Node* victim_node = nullptr;
    Node* tail_owner = nullptr;
    size_t tail_index = 0;
    uint64_t oldest = std::numeric_limits<uint64_t>::max();
    auto scan_tails = [&](Node* n) {
      for (size_t i = 0; i < n->tails.size(); ++i)
        if (n->tails[i]->last_used < oldest) {
          oldest = n->tails[i]->last_used;
          tail_owner = n;
          tail_index = i;
          victim_node = nullptr;
        }
    };
    scan_tails(root_.get());
    for (Node* n : nodes_) {
      scan_tails(n);
      if (n->children.empty() && n->tails.empty() && n->last_used < oldest) {
        oldest = n->last_used;
        victim_node = n;
        tail_owner = nullptr;
      }
    }
    if (victim_node) {
      Node* p = victim_node->parent;
      remove_node(victim_node);
      prune_dead(p);
    } else if (tail_owner) {
      bytes_ -= tail_bytes(*tail_owner->tails[tail_index]);
      release_state(tail_owner->tails[tail_index]->rec);
      tail_owner->tails.erase(tail_owner->tails.begin() + std::ptrdiff_t(tail_index));
      ++evictions_;
      prune_dead(tail_owner);
    } else {
      break;  // nothing left
    }
  }
}

void PrefixCache::clear() {
  root_ = std::make_unique<Node>();
  nodes_.clear();
  bytes_ = 0;
  ++version_;
  free_dev_.clear();
  spare_host_.clear();
  for (int i = opt_.n_dev_states - 1; i >= 0; --i) free_dev_.push_back(i);
}

// A new state goes to a spare slot when the first tier has one (a device copy), else to RAM.
void PrefixCache::store_state(State& st, const StateSource& src) {
  const int slot = opt_.n_dev_states > 0 ? take_dev_slot() : -1;
  if (slot >= 0) {
    src.save(slot);
    st.dev = slot;
    return;
  }
  take_host(st);
  src.read(st.host.data());
  bytes_ += int64_t(opt_.rec_floats * sizeof(float));
}

// Bytes of a released host state are the caller's to uncount (they are part of the entry's bytes).
void PrefixCache::release_state(State& st) {
  if (st.dev >= 0) free_dev_.push_back(st.dev);
  st.dev = -1;
  if (!st.host.empty() && spare_host_.size() < kSpareHost) spare_host_.push_back(std::move(st.host));
  st.host = {};
}

void PrefixCache::take_host(State& st) {
  if (!spare_host_.empty()) {
    st.host = std::move(spare_host_.back());
    spare_host_.pop_back();
  }
  st.host.resize(opt_.rec_floats);
}

int PrefixCache::take_dev_slot() {
  if (!free_dev_.empty()) {
    const int s = free_dev_.back();
    free_dev_.pop_back();
    return s;
  }
  State* victim = nullptr;
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  auto consider = [&](State& st, uint64_t used) {
    if (st.dev >= 0 && used < oldest) oldest = used, victim = &st;
  };
  for (Node* n : nodes_) {
    consider(n->rec, n->last_used);
    for (auto& t : n->tails) consider(t->rec, t->last_used);
  }
  for (auto& t : root_->tails) consider(t->rec, t->last_used);
  if (!victim) return -1;
  // The least recently used slot's state moves to RAM (evict_to_bound then applies the RAM bound).
  const int s = victim->dev;
  take_host(*victim);
  opt_.read_dev(s, victim->host.data());
  victim->dev = -1;
  bytes_ += int64_t(opt_.rec_floats * sizeof(float));
  return s;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s;
  s.n_nodes = int64_t(nodes_.size());
  s.bytes = bytes_;
  s.evictions = evictions_;
  auto count = [&](const Node* n) {
    s.n_tails += int64_t(n->tails.size());
    for (auto& t : n->tails) {
      s.n_states += t->rec.empty() ? 0 : 1;
      s.n_dev_states += t->rec.dev >= 0 ? 1 : 0;
    }
    s.n_states += n->rec.empty() ? 0 : 1;
    s.n_dev_states += n->rec.dev >= 0 ? 1 : 0;
  };
  count(root_.get());
  for (const Node* n : nodes_) count(n);
  return s;
}

}  // namespace kiln::engine
