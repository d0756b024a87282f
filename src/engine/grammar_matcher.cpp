// engine/grammar_matcher.cpp — vocabulary trie, the lazily built grammar DFA and its token masks
//   (see grammar_matcher.h).
#include "engine/grammar_matcher.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace kiln::engine {

namespace {
// Sets bits [b, e) of a bit array.
void set_bits(uint64_t* w, uint32_t b, uint32_t e) {
  if (b >= e) return;
  const uint32_t wb = b >> 6, we = (e - 1) >> 6;
  const uint64_t lo = ~uint64_t(0) << (b & 63), hi = ~uint64_t(0) >> (63 - ((e - 1) & 63));
  if (wb == we) {
    w[wb] |= lo & hi;
    return;
  }
  w[wb] |= lo;
  for (uint32_t i = wb + 1; i < we; ++i) w[i] = ~uint64_t(0);
  w[we] |= hi;
}
void clear_bits(uint64_t* w, uint32_t b, uint32_t e) {
  if (b >= e) return;
  const uint32_t wb = b >> 6, we = (e - 1) >> 6;
  const uint64_t lo = ~uint64_t(0) << (b & 63), hi = ~uint64_t(0) >> (63 - ((e - 1) & 63));
  if (wb == we) {
    w[wb] &= ~(lo & hi);
    return;
  }
  w[wb] &= ~lo;
  for (uint32_t i = wb + 1; i < we; ++i) w[i] = 0;
  w[we] &= ~hi;
}
}  // namespace

// ============================================================================================
// TokenTrie

bool TokenTrie::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

std::shared_ptr<const TokenTrie> TokenTrie::build(std::vector<std::string> pieces, std::vector<int32_t> eog) {
  auto t = std::make_shared<TokenTrie>();
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  t->eog_ = std::move(eog);
  for (int32_t e : t->eog_)
    if (e >= 0 && size_t(e) < pieces.size()) pieces[size_t(e)].clear();  // EOG is the end, not text
  t->pieces_ = std::move(pieces);
  const auto& P = t->pieces_;
  std::vector<int32_t> order;
  for (size_t i = 0; i < P.size(); ++i)
    if (!P[i].empty() && P[i].size() < 65535) order.push_back(int32_t(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return P[size_t(a)] < P[size_t(b)] || (P[size_t(a)] == P[size_t(b)] && a < b); });

  // Preorder construction from the sorted pieces: `path` holds the nodes of the previous piece.
  t->byte_.push_back(0);
  t->depth_.push_back(0);
  t->parent_.push_back(0);
  t->end_.push_back(0);
  t->tok_begin_.push_back(0);
  std::vector<uint32_t> path{0};
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = P[size_t(id)];
    size_t common = 0;
    if (prev)
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    while (path.size() > common + 1) {  // close the nodes deeper than the common prefix
      t->end_[path.back()] = uint32_t(t->byte_.size());
      path.pop_back();
    }
    for (size_t k = common; k < s.size(); ++k) {
      t->parent_.push_back(path.back());
      path.push_back(uint32_t(t->byte_.size()));
      t->byte_.push_back(uint8_t(s[k]));
      t->depth_.push_back(uint16_t(k + 1));
      t->end_.push_back(0);
      t->tok_begin_.push_back(uint32_t(t->toks_.size()));
    }
    t->toks_.push_back(id);  // ends at path.back(): its range grows until the next node starts
    t->tok_node_.push_back(path.back());
    t->max_depth_ = std::max(t->max_depth_, s.size());
    prev = &s;
  }
  while (!path.empty()) {
    t->end_[path.back()] = uint32_t(t->byte_.size());
    path.pop_back();
  }
  t->tok_begin_.push_back(uint32_t(t->toks_.size()));
  return t;
}

std::shared_ptr<const TokenTrie> TokenTrie::build(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& eog,
                                                  int64_t n_vocab, const std::vector<int32_t>& preserved) {
  std::vector<std::string> pieces(size_t(std::max<int64_t>(n_vocab, 0)));
  const int64_t n = std::min<int64_t>(n_vocab, tok.n_tokens());
  for (int64_t i = 0; i < n; ++i) pieces[size_t(i)] = tok.token_to_piece(int32_t(i), false);
  for (int32_t id : preserved)
    if (id >= 0 && id < n) pieces[size_t(id)] = tok.token_to_piece(id, true);
  return build(std::move(pieces), eog);
}

// ============================================================================================
// GrammarAutomaton

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie, Options o)
    : g_(std::move(g)), trie_(std::move(trie)), opt_(o) {
  el_ = g_->elems().data();
  nodes_.push_back({0xFFFFFFFFu, 0});  // node 0: the empty stack
  tmp_.clear();
  visited_.clear();
  for (uint32_t a : g_->alts(g_->root())) expand(a, 0);
  start_ = intern_state();
  if (start_ == kDead) {  // a grammar that derives nothing: a state with no stacks
    states_.push_back(State{uint32_t(pool_.size()), 0, false, false, -1});
    trans_.resize(trans_.size() + 256, kDead);
    start_ = uint32_t(states_.size() - 1);
  }
  walk_.resize(trie_->max_depth_ + 1);
  path_.resize(trie_->max_depth_ + 1);
  chain_.resize(trie_->max_depth_ + 1);
  scratch_mask_.resize(trie_->words());
  ctx_bits_.resize((trie_->toks_.size() + 64) / 64);
}

uint32_t GrammarAutomaton::intern_stack(uint32_t pos, uint32_t parent) {
  const uint64_t key = uint64_t(pos) << 32 | parent;
  auto [it, added] = node_ids_.emplace(key, uint32_t(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

// Adds to tmp_ every stack reachable from "match position pos, then continue with stack
// `parent`" without consuming a byte: rule references are entered (the continuation is pushed
// unless it is the end of the alternative: tail calls keep stacks flat), ends pop.
void GrammarAutomaton::expand(uint32_t pos, uint32_t parent) {
  if (!visited_.emplace(uint64_t(pos) << 32 | parent, 1).second) return;
  const Grammar::Elem& e = el_[pos];
  switch (e.kind) {
    case Grammar::Kind::Bytes: tmp_.push_back(intern_stack(pos, parent)); return;
    case Grammar::Kind::End:
      if (parent == 0) tmp_.push_back(0);
      else expand(nodes_[parent].first, nodes_[parent].second);
      return;
    case Grammar::Kind::Ref: {
      const uint32_t cont = el_[pos + 1].kind == Grammar::Kind::End ? parent : intern_stack(pos + 1, parent);
      for (uint32_t a : g_->alts(e.arg)) expand(a, cont);
      return;
    }
  }
}

uint32_t GrammarAutomaton::intern_state() {
  std::sort(tmp_.begin(), tmp_.end());
  tmp_.erase(std::unique(tmp_.begin(), tmp_.end()), tmp_.end());
  if (tmp_.empty()) return kDead;
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (uint32_t x : tmp_) h = (h ^ x) * 0x100000001B3ull + (h >> 29);
  auto range = state_ids_.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const State& s = states_[it->second];
    if (s.len == tmp_.size() && std::equal(tmp_.begin(), tmp_.end(), pool_.begin() + s.off)) return it->second;
  }
  State s;
  s.off = uint32_t(pool_.size());
  s.len = uint32_t(tmp_.size());
  s.accepting = tmp_[0] == 0;  // sorted: the empty stack (id 0) comes first
  s.only_end = s.accepting && tmp_.size() == 1;
  pool_.insert(pool_.end(), tmp_.begin(), tmp_.end());
  const uint32_t id = uint32_t(states_.size());
  states_.push_back(s);
  trans_.resize(trans_.size() + 256, kUnknown);
  state_ids_.emplace(h, id);
  return id;
}

uint32_t GrammarAutomaton::compute(uint32_t s, uint8_t b) {
  tmp_.clear();
  visited_.clear();
  const State st = states_[s];
  for (uint32_t k = 0; k < st.len; ++k) {
    const uint32_t id = pool_[st.off + k];
    if (id == 0) continue;
    const auto [pos, parent] = nodes_[id];
    if (g_->byte_sets()[el_[pos].arg].has(b)) expand(pos + 1, parent);
  }
  const uint32_t t = intern_state();
  trans_[size_t(s) * 256 + b] = t;
  return t;
}

uint32_t GrammarAutomaton::next_token(uint32_t s, int32_t token) {
  if (token < 0 || token >= trie_->n_vocab()) return kDead;
  if (trie_->is_eog(token)) return accepting(s) ? s : kDead;
  const std::string& p = trie_->piece(token);
  if (p.empty()) return kDead;
  return advance(s, p);
}

// --------------------------------------------------------------------------------------------
// Token masks

void GrammarAutomaton::mask_by_trie_walk(uint32_t s, uint64_t* m) {
  const TokenTrie& T = *trie_;
  std::fill(m, m + T.words(), 0);
  // Preorder walk: walk_[d] is the state after the first d bytes of the current node's prefix.
  walk_[0] = s;
  const uint32_t n = uint32_t(T.byte_.size());
  const uint8_t* byte = T.byte_.data();
  const uint16_t* depth = T.depth_.data();
  const uint32_t* end = T.end_.data();
  const uint32_t* tb = T.tok_begin_.data();
  const int32_t* toks = T.toks_.data();
  for (uint32_t i = 1; i < n;) {
    const uint32_t d = depth[i];
    const uint32_t prev = walk_[d - 1];
    uint32_t t = trans_[size_t(prev) * 256 + byte[i]];
    if (t == kUnknown) t = compute(prev, byte[i]);
    if (t == kDead) {
      i = end[i];
      continue;
    }
    walk_[d] = t;
    for (uint32_t k = tb[i]; k < tb[i + 1]; ++k) m[uint32_t(toks[k]) >> 6] |= uint64_t(1) << (toks[k] & 63);
    ++i;
  }
  if (states_[s].accepting)
    for (int32_t e : T.eog_)
      if (e >= 0 && e < T.n_vocab()) m[size_t(e) >> 6] |= uint64_t(1) << (e & 63);
}

const uint64_t* GrammarAutomaton::mask(uint32_t s) {
  if (states_[s].mask >= 0) return masks_[size_t(states_[s].mask)].data();
  if (opt_.window_depth <= 0) {
    mask_by_trie_walk(s, scratch_mask_.data());
  } else {
    uint64_t* m = scratch_mask_.data();
    std::fill(scratch_mask_.begin(), scratch_mask_.end(), 0);
    bool any_ctx = false;
    const uint32_t off = states_[s].off, len = states_[s].len;
    uint32_t last = kUnknown;  // windows repeat within a state (same top, other contexts): OR once
    uint64_t gen = window_gen_;
    for (uint32_t k = 0; k < len; ++k) {
      const uint32_t id = pool_[off + k];
      if (id == 0) continue;
      const uint32_t wi = window_of(id);
      if (window_gen_ != gen) {  // the windows were dropped: indices start again
        gen = window_gen_;
        last = kUnknown;
      }
      if (wi == last) continue;
      last = wi;
      const Window& w = windows_[wi];
      if (!w.acc_bits.empty())
        for (size_t i = 0; i < w.acc_bits.size(); ++i) m[i] |= w.acc_bits[i];
      for (int32_t t : w.acc_ids) m[uint32_t(t) >> 6] |= uint64_t(1) << (t & 63);
      for (const auto& [b, e] : w.ctx) set_bits(ctx_bits_.data(), b, e);
      any_ctx |= !w.ctx.empty();
    }
    if (any_ctx) check_context_tokens(s, m);
    const TokenTrie& T = *trie_;
    if (states_[s].accepting)
      for (int32_t e : T.eog_)
        if (e >= 0 && e < T.n_vocab()) m[size_t(e) >> 6] |= uint64_t(1) << (e & 63);
  }
  ++masks_computed_;
  store_mask(s);
  return states_[s].mask >= 0 ? masks_[size_t(states_[s].mask)].data() : scratch_mask_.data();
}

void GrammarAutomaton::store_mask(uint32_t s) {
  const size_t bytes = scratch_mask_.size() * sizeof(uint64_t);
  if (mask_bytes_ + bytes > opt_.mask_cache_bytes) {  // over budget: forget every cached mask
    for (auto& st : states_) st.mask = -1;
    masks_.clear();
    mask_bytes_ = 0;
  }
  if (bytes <= opt_.mask_cache_bytes) {
    states_[s].mask = int32_t(masks_.size());
    masks_.push_back(scratch_mask_);
    mask_bytes_ += bytes;
  }
}

// Runs the context-dependent tokens (ctx_bits_, by trie order) through state s, sets the bits of
// those that live and clears ctx_bits_. A restricted walk of the trie: path_[d] / walk_[d] are the
// nodes and states of the current path, reused up to the next token's deepest ancestor on it (found
// by the preorder ranges), and a node that dies skips every token below it at once.
void GrammarAutomaton::check_context_tokens(uint32_t s, uint64_t* m) {
  const TokenTrie& T = *trie_;
  const int32_t* toks = T.toks_.data();
  const uint32_t* tok_node = T.tok_node_.data();
  const uint32_t* end = T.end_.data();
  const uint32_t* tb = T.tok_begin_.data();
  const uint32_t* parent = T.parent_.data();
  const uint16_t* depth = T.depth_.data();
  const uint8_t* byte = T.byte_.data();
  uint64_t* c = ctx_bits_.data();
  const uint32_t n_ranks = uint32_t(T.toks_.size());
  path_[0] = 0;
  walk_[0] = s;
  uint32_t top = 0;  // depth of the last node on the path
  uint32_t* chain = chain_.data();
  for (uint32_t wi = 0; wi < ctx_bits_.size(); ++wi) {
    while (c[wi]) {
      const uint32_t r = wi * 64 + uint32_t(__builtin_ctzll(c[wi]));
      c[wi] &= c[wi] - 1;
      if (r >= n_ranks) continue;
      const int32_t id = toks[r];
      if ((m[uint32_t(id) >> 6] >> (id & 63)) & 1) continue;  // accepted by some window already
      const uint32_t n = tok_node[r];
      while (top > 0 && !(path_[top] <= n && n < end[path_[top]])) --top;
      uint32_t k = 0;
      for (uint32_t x = n; depth[x] > top; x = parent[x]) chain[k++] = x;
      ++context_checks_;
      bool dead = false;
      while (k > 0) {
        const uint32_t x = chain[--k];
        const uint32_t t = next(walk_[top], byte[x]);
        if (t == kDead) {  // every token below x dies too: clear their bits
          clear_bits(c, r + 1, tb[end[x]]);
          dead = true;
          break;
        }
        path_[++top] = x;
        walk_[top] = t;
      }
      if (!dead) m[uint32_t(id) >> 6] |= uint64_t(1) << (id & 63);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Windows

// The window of a stack: its top window_depth positions over the empty stack (interned in the same
// arena: the window's "end" is then the empty stack, i.e. an accepting state), cut when the stack
// is deeper. A stack no deeper than the window is its own window, uncut: its classes are exact.
uint32_t GrammarAutomaton::window_of(uint32_t stack) {
  if (stack < stack_window_.size() && stack_window_[stack]) return stack_window_[stack] - 1;
  uint32_t chain[64];
  const int depth = std::min(opt_.window_depth, 64);
  int n = 0;
  uint32_t id = stack;
  for (; n < depth && id != 0; id = nodes_[id].second) chain[n++] = nodes_[id].first;
  const bool cut = id != 0;
  uint32_t top = 0;
  for (int k = n - 1; k >= 0; --k) top = intern_stack(chain[k], top);
  const uint64_t key = uint64_t(top) << 1 | uint64_t(cut);
  auto it = window_ids_.find(key);
  uint32_t wi;
  if (it != window_ids_.end()) {
    wi = it->second;
  } else {
    Window w;
    classify(top, cut, w);
    const size_t bytes = w.acc_bits.size() * 8 + w.acc_ids.size() * 4 + w.ctx.size() * 8 + 64;
    if (window_bytes_ + bytes > opt_.window_cache_bytes) {  // over budget: forget every window
      windows_.clear();
      window_ids_.clear();
      std::fill(stack_window_.begin(), stack_window_.end(), 0);
      window_bytes_ = 0;
      ++window_gen_;
    }
    window_bytes_ += bytes;
    wi = uint32_t(windows_.size());
    windows_.push_back(std::move(w));
    window_ids_.emplace(key, wi);
  }
  if (stack_window_.size() <= stack) stack_window_.resize(std::max<size_t>(nodes_.size(), stack + 1), 0);
  stack_window_[stack] = wi + 1;
  return wi;
}

// One walk of the trie from the state {top}. A token whose node is reached alive is accepted; in
// a cut window, a token that dies (or cannot go on) after the window could end at one of its proper
// prefixes is context-dependent — whole subtrees, so ranges of trie-ordered token indices; the rest
// is rejected. Uncut, the window's end is the grammar's: nothing follows it.
void GrammarAutomaton::classify(uint32_t top, bool cut, Window& w) {
  const TokenTrie& T = *trie_;
  tmp_.assign(1, top);
  const uint32_t s0 = intern_state();
  const uint32_t n = uint32_t(T.byte_.size());
  const uint8_t* byte = T.byte_.data();
  const uint16_t* depth = T.depth_.data();
  const uint32_t* end = T.end_.data();
  const uint32_t* tb = T.tok_begin_.data();
  const int32_t* toks = T.toks_.data();
  auto add_ctx = [&](uint32_t b, uint32_t e) {
    if (b >= e) return;
    if (!w.ctx.empty() && w.ctx.back().second == b) w.ctx.back().second = e;
    else w.ctx.emplace_back(b, e);
  };
  std::vector<uint64_t>& acc = scratch_acc_;  // accepted ids, bit per id
  acc.assign(T.words(), 0);
  size_t n_acc = 0;
  walk_[0] = s0;
  exit_.assign(T.max_depth_ + 1, 0);
  for (uint32_t i = 1; i < n; ++classify_nodes_) {
    const uint32_t d = depth[i];
    const uint32_t prev = walk_[d - 1];
    uint32_t t = trans_[size_t(prev) * 256 + byte[i]];
    if (t == kUnknown) t = compute(prev, byte[i]);
    if (t == kDead) {
      if (cut && exit_[d - 1]) add_ctx(tb[i], tb[end[i]]);
      i = end[i];
      continue;
    }
    walk_[d] = t;
    exit_[d] = exit_[d - 1] || states_[t].accepting;
    for (uint32_t k = tb[i]; k < tb[i + 1]; ++k) acc[uint32_t(toks[k]) >> 6] |= uint64_t(1) << (toks[k] & 63);
    n_acc += tb[i + 1] - tb[i];
    if (states_[t].only_end) {  // the window has ended: nothing more is read inside it
      if (cut) add_ctx(tb[i + 1], tb[end[i]]);
      i = end[i];
      continue;
    }
    ++i;
  }
  if (n_acc * 32 >= size_t(T.n_vocab())) {  // a list would be larger than the bits
    w.acc_bits = acc;
  } else {
    w.acc_ids.reserve(n_acc);
    for (size_t i = 0; i < acc.size(); ++i)
      for (uint64_t b = acc[i]; b; b &= b - 1) w.acc_ids.push_back(int32_t(i * 64 + size_t(__builtin_ctzll(b))));
  }
}

void GrammarAutomaton::precompute(size_t max_stacks, size_t max_nodes) {
  if (opt_.window_depth <= 0) return;
  const size_t nodes0 = classify_nodes_;
  std::vector<uint32_t> queue(pool_.begin() + states_[start_].off, pool_.begin() + states_[start_].off + states_[start_].len);
  std::vector<char> seen(nodes_.size(), 0);
  for (uint32_t id : queue) seen[id] = 1;
  std::vector<uint32_t> next_stacks;
  for (size_t qi = 0; qi < queue.size() && qi < max_stacks; ++qi) {
    if (classify_nodes_ - nodes0 >= max_nodes || window_bytes_ * 2 > opt_.window_cache_bytes) break;
    const uint32_t id = queue[qi];
    if (id == 0) continue;
    const auto [pos, parent] = nodes_[id];
    if (g_->byte_sets()[el_[pos].arg] == ByteSet{}) continue;  // a class that matches nothing
    // The stacks after one byte at pos (which byte does not matter to the stack shape).
    tmp_.clear();
    visited_.clear();
    expand(pos + 1, parent);
    next_stacks = tmp_;
    (void)window_of(id);
    if (seen.size() < nodes_.size()) seen.resize(nodes_.size(), 0);
    for (uint32_t t : next_stacks)
      if (!seen[t]) {
        seen[t] = 1;
        queue.push_back(t);
      }
  }
}

size_t GrammarAutomaton::memory_bytes() const {
  return nodes_.size() * (sizeof(nodes_[0]) + 24) + pool_.size() * 4 + states_.size() * (sizeof(State) + 24) +
         trans_.size() * 4 + mask_bytes_ + window_bytes_ + stack_window_.size() * 4;
}

// ============================================================================================
// GrammarMatcher

bool GrammarMatcher::accept_token(int32_t token) {
  const uint32_t t = a_->next_token(s_, token);
  if (t == GrammarAutomaton::kDead) return false;
  s_ = t;
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  const uint32_t t = a_->advance(s_, bytes);
  if (t == GrammarAutomaton::kDead) return false;
  s_ = t;
  return true;
}

bool GrammarMatcher::any_allowed() {
  if (can_end()) return true;
  const uint64_t* m = mask();
  const size_t w = a_->trie().words();
  for (size_t i = 0; i < w; ++i)
    if (m[i]) return true;
  return false;
}

// ============================================================================================
// GrammarCache

GrammarCache::GrammarCache(const tokenizer::Tokenizer* tok, std::vector<int32_t> eog, int64_t n_vocab, size_t max_entries)
    : tok_(tok), eog_(std::move(eog)), n_vocab_(n_vocab), max_entries_(std::max<size_t>(1, max_entries)) {}

GrammarCache::GrammarCache(std::shared_ptr<const TokenTrie> trie, size_t max_entries)
    : max_entries_(std::max<size_t>(1, max_entries)), trie_(std::move(trie)) {}

const TokenTrie& GrammarCache::trie() { return *trie_for({}); }

std::shared_ptr<const TokenTrie> GrammarCache::trie_for(const std::vector<int32_t>& preserved) {
  std::lock_guard<std::mutex> lk(trie_mu_);
  if (!trie_) {
    KILN_CHECK(tok_ != nullptr, "GrammarCache without a tokenizer or trie");
    trie_ = TokenTrie::build(*tok_, eog_, n_vocab_);
  }
  if (preserved.empty() || !tok_) return trie_;
  auto t = std::find_if(preserved_tries_.begin(), preserved_tries_.end(), [&](const auto& e) { return e.first == preserved; });
  if (t == preserved_tries_.end()) {
    preserved_tries_.emplace_back(preserved, TokenTrie::build(*tok_, eog_, n_vocab_, preserved));
    t = preserved_tries_.end() - 1;
  }
  return t->second;
}

std::string GrammarCache::key(const Grammar& g, const std::vector<int32_t>& preserved) const {
  std::string k = g.text() + '\0' + g.rule_name(g.root());
  if (!preserved.empty() && tok_) {
    k += '\0';
    for (int32_t id : preserved) k += std::to_string(id) + ',';
  }
  return k;
}

std::shared_ptr<GrammarAutomaton> GrammarCache::prepare(const std::shared_ptr<const Grammar>& g,
                                                       const std::vector<int32_t>& preserved) {
  {
    std::lock_guard<std::mutex> lk(entries_mu_);
    if (entries_.count(key(*g, preserved))) return nullptr;
  }
  auto a = std::make_shared<GrammarAutomaton>(g, trie_for(preserved));
  a->precompute();
  (void)a->mask(a->start());
  return a;
}

std::shared_ptr<GrammarAutomaton> GrammarCache::get(const std::shared_ptr<const Grammar>& g,
                                                   const std::vector<int32_t>& preserved,
                                                   std::shared_ptr<GrammarAutomaton> prepared) {
  std::shared_ptr<const TokenTrie> trie = trie_for(preserved);
  const std::string k = key(*g, preserved);
  std::lock_guard<std::mutex> lk(entries_mu_);
  auto it = entries_.find(k);
  if (it == entries_.end()) {
    if (entries_.size() >= max_entries_) {
      auto lru = std::min_element(entries_.begin(), entries_.end(),
                                  [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
      entries_.erase(lru);  // requests still using it keep it alive
    }
    const bool usable = prepared && &prepared->grammar() == g.get() && &prepared->trie() == trie.get();
    it = entries_.emplace(k, Entry{usable ? std::move(prepared) : std::make_shared<GrammarAutomaton>(g, trie), 0}).first;
  }
  it->second.last_used = ++clock_;
  return it->second.a;
}

}  // namespace kiln::engine
