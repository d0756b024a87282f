// engine/grammar_matcher.h — constrained decoding: a compiled Grammar (grammar.h) run over a
//   vocabulary, giving the set of tokens allowed next and advancing by the token sampled.
//
// How it is fast (the xgrammar / llguidance idea, our own construction):
//   - A matcher's configuration is a set of pushdown stacks; stacks are hash-consed persistent
//     lists, so a configuration is a sorted list of small ids and is interned as a *state*.
//   - GrammarAutomaton memoises state × byte → state (a lazily built DFA over the reachable
//     configurations, one dense 256-entry row per state), so advancing by a byte is an array read
//     once seen. Repetitions compile to tail calls, so e.g. every character of a JSON string
//     leads back to the same state.
//   - The vocabulary is a byte trie in preorder (TokenTrie, built once per tokenizer). A state's
//     token mask is cached per state: in steady state a mask costs a lookup.
//   - A state met for the first time does not walk the whole trie. Its mask is the union over its
//     stacks, and a stack's tokens are classified once per *window* — the stack's top
//     `window_depth` positions with nothing below (a static piece of the grammar, shared by every
//     stack and state that has it on top): accepted (the token is consumed inside the window, so
//     whatever lies below), rejected (it dies inside the window), or context-dependent (the window
//     can end at a proper prefix of the token, the rest then depends on what is below). A new
//     state's mask = the OR of its windows' accepted sets, plus its windows' context-dependent
//     tokens each run through the state itself (usually a small set: at 248K tokens a JSON string
//     window leaves the tokens that contain its closing quote). precompute() classifies the
//     windows of every stack reachable from the start (GrammarCache::prepare calls it off the
//     engine thread); a window first met later is classified then (one trie walk).
//     NOTE: window_depth = 0 keeps the former scheme (every new state one walk of the whole trie):
//     the reference the tests compare against, and the bench's "before".
// Owns: TokenTrie, GrammarAutomaton (states, transitions, cached masks), GrammarMatcher (one
//   request's position), GrammarCache (automata shared by requests with the same grammar).
// Must not: parse JSON or know about requests, sampling or the model (the engine applies masks
//   through Sampler::sample and feeds sampled tokens back).
// Threading: TokenTrie is immutable and shareable. GrammarAutomaton, GrammarMatcher and
//   GrammarCache are used by one thread (the engine thread); they allocate when they meet a new
//   state (memoised), never per step in steady state. Exceptions: GrammarCache::trie_for() and
//   prepare() may be called from any thread (Engine::submit; the cache's entries are behind a
//   mutex, held briefly); a prepared automaton (its windows precomputed there) belongs to the
//   submitting thread until it is handed to the engine with the request.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/grammar.h"

namespace kiln::tokenizer {
class Tokenizer;
}

namespace kiln::engine {

// The vocabulary as a byte trie. Tokens with empty text (control tokens) are not in it and are
// never allowed by a grammar, except end-of-generation tokens, allowed when the grammar is complete,
// and preserved control tokens (a tool-call format's markers), which are in it with their text.
class TokenTrie {
 public:
  // pieces[id] = the bytes token id stands for ("" = never allowed); eog = end-of-generation ids.
  static std::shared_ptr<const TokenTrie> build(std::vector<std::string> pieces, std::vector<int32_t> eog);
  // From a tokenizer: token_to_piece(id, special=false) for every id < n_vocab (ids beyond the
  // tokenizer's vocabulary, padding rows of the output matrix, are never allowed).
  // `preserved`: control tokens that stand for their text (token_to_piece(id, special=true)).
  static std::shared_ptr<const TokenTrie> build(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& eog,
                                                int64_t n_vocab, const std::vector<int32_t>& preserved = {});

  int64_t n_vocab() const { return int64_t(pieces_.size()); }
  size_t n_nodes() const { return byte_.size(); }
  size_t words() const { return (pieces_.size() + 63) / 64; }  // mask length in uint64
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  bool is_eog(int32_t id) const;

 private:
  friend class GrammarAutomaton;
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;        // sorted
  // Nodes in preorder; node 0 is the root (the empty prefix).
  std::vector<uint8_t> byte_;       // the byte leading to the node
  std::vector<uint16_t> depth_;     // prefix length
  std::vector<uint32_t> end_;       // one past the node's subtree
  std::vector<uint32_t> tok_begin_; // tokens ending at node i: toks_[tok_begin_[i] .. tok_begin_[i+1])
  std::vector<int32_t> toks_;
  std::vector<uint32_t> parent_;    // per node (the root's is 0)
  std::vector<uint32_t> tok_node_;  // per toks_ index: the node the token ends at
  size_t max_depth_ = 0;
};

// The lazily built DFA of one grammar over one vocabulary.
class GrammarAutomaton {
 public:
  static constexpr uint32_t kDead = 0xFFFFFFFEu;
  struct Options {
    size_t mask_cache_bytes = size_t(256) << 20;  // cached masks beyond this are dropped (recomputed on demand)
    // Positions per window (above); 0: every new state's mask is one walk of the whole trie.
    int window_depth = 3;
    // Window classes beyond this are dropped (reclassified on demand); precompute() stops at half.
    size_t window_cache_bytes = size_t(256) << 20;
  };
  GrammarAutomaton(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie, Options o);
  GrammarAutomaton(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie)
      : GrammarAutomaton(std::move(g), std::move(trie), Options{}) {}

  uint32_t start() const { return start_; }
  uint32_t next(uint32_t s, uint8_t b) {
    const uint32_t t = trans_[size_t(s) * 256 + b];
    return t != kUnknown ? t : compute(s, b);
  }
  uint32_t advance(uint32_t s, std::string_view bytes) {
    for (char c : bytes) {
      s = next(s, uint8_t(c));
      if (s == kDead) break;
    }
    return s;
  }
  bool accepting(uint32_t s) const { return states_[s].accepting; }  // the grammar may end here
  bool only_end(uint32_t s) const { return states_[s].only_end; }    // nothing but the end is possible
  // Tokens allowed in state s: bit id of words()-long array. Valid until the next mask() call.
  const uint64_t* mask(uint32_t s);
  // The token's successor state (kDead if the grammar rejects it). EOG ids: s itself when accepting.
  uint32_t next_token(uint32_t s, int32_t token);
  // Classifies the tokens of the windows of the stacks reachable from the start (breadth first, at
  // most `max_stacks` stacks, stopping once the classifying walks have visited `max_nodes` trie
  // nodes — ≈ 430 walks of a 248K-token trie, ≈ 1 s on a 2-core box — or the windows fill half
  // their cache), so that new states met later find their windows classified. A window left out
  // is classified when met.
  void precompute(size_t max_stacks = 32768, size_t max_nodes = size_t(256) << 20);
  // The reference: s's mask by one walk of the whole trie, whatever the options (tests).
  void mask_by_trie_walk(uint32_t s, uint64_t* out);

  const Grammar& grammar() const { return *g_; }
  const TokenTrie& trie() const { return *trie_; }
  size_t n_states() const { return states_.size(); }
  size_t masks_computed() const { return masks_computed_; }
  size_t n_windows() const { return windows_.size(); }
  size_t context_checks() const { return context_checks_; }  // context-dependent tokens run through a state
  size_t memory_bytes() const;

 private:
  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  struct State {
    uint32_t off = 0, len = 0;  // stacks in pool_
    bool accepting = false, only_end = false;
    int32_t mask = -1;          // index into masks_ (-1: not cached)
  };
  // A window's token classes. Accepted ids as a bit set (when many) or a sorted list; the
  // context-dependent ones as ranges of TokenTrie::toks_ indices (trie order), disjoint and sorted.
  struct Window {
    std::vector<uint64_t> acc_bits;
    std::vector<int32_t> acc_ids;
    std::vector<std::pair<uint32_t, uint32_t>> ctx;
  };
  uint32_t compute(uint32_t s, uint8_t b);
  uint32_t intern_stack(uint32_t pos, uint32_t parent);
  void expand(uint32_t pos, uint32_t parent);
  uint32_t intern_state();  // from tmp_
  void store_mask(uint32_t s);  // scratch_mask_ into the cache
  uint32_t window_of(uint32_t stack);
  void classify(uint32_t top, bool cut, Window& w);
  void check_context_tokens(uint32_t s, uint64_t* m);

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenTrie> trie_;
  Options opt_;
  const Grammar::Elem* el_ = nullptr;
  std::vector<std::pair<uint32_t, uint32_t>> nodes_;     // stack node: (position, parent node); 0 = empty
  std::unordered_map<uint64_t, uint32_t> node_ids_;
  std::vector<uint32_t> pool_;                           // states' stack lists
  std::vector<State> states_;
  std::unordered_multimap<uint64_t, uint32_t> state_ids_;  // hash of the stack list → state
  std::vector<uint32_t> trans_;                          // [state * 256 + byte]
  std::vector<std::vector<uint64_t>> masks_;             // cached masks
  size_t mask_bytes_ = 0;
  size_t masks_computed_ = 0;
  uint32_t start_ = 0;
  std::vector<Window> windows_;
  std::unordered_map<uint64_t, uint32_t> window_ids_;  // (window's stack node << 1 | cut) → windows_
  std::vector<uint32_t> stack_window_;                 // stack node → windows_ index + 1 (0: not yet)
  size_t window_bytes_ = 0;
  uint64_t window_gen_ = 0;     // bumped when the windows are dropped (window_cache_bytes)
  size_t classify_nodes_ = 0;   // trie nodes visited by classify()
  size_t context_checks_ = 0;
  // scratch
  std::vector<uint32_t> tmp_;
  std::unordered_map<uint64_t, char> visited_;
  std::vector<uint32_t> walk_;
  std::vector<char> exit_;  // classify(): the window can end within the first d bytes
  std::vector<uint64_t> scratch_acc_;  // classify(): the accepted tokens
  std::vector<uint64_t> scratch_mask_;
  std::vector<uint64_t> ctx_bits_;  // mask(): the state's context-dependent tokens, bit per toks_ index
  std::vector<uint32_t> path_;      // check_context_tokens(): the nodes of the current trie path
  std::vector<uint32_t> chain_;     //   and the nodes from there down to the next token's
};

// One request's position in a grammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> a) : a_(std::move(a)), s_(a_->start()) {}
  // Allowed next tokens (bit per id), valid until the next mask() on any matcher of the automaton.
  const uint64_t* mask() { return a_->mask(s_); }
  // Advances by a token / raw bytes; false (position unchanged) when the grammar rejects them.
  bool accept_token(int32_t token);
  bool accept_bytes(std::string_view bytes);
  bool can_end() const { return a_->accepting(s_); }
  bool done() const { return a_->only_end(s_); }  // complete, and nothing may follow
  bool any_allowed();                              // some token (or the end) can come next
  const GrammarAutomaton& automaton() const { return *a_; }

 private:
  std::shared_ptr<GrammarAutomaton> a_;
  uint32_t s_;
};

// Automata by grammar text, shared by requests (most requests of a client repeat one schema), with
// the vocabulary trie they all use. Engine thread only, except trie_for() and prepare().
class GrammarCache {
 public:
  // The trie is built on first use from `tok` (which must outlive the cache).
  GrammarCache(const tokenizer::Tokenizer* tok, std::vector<int32_t> eog, int64_t n_vocab, size_t max_entries = 16);
  explicit GrammarCache(std::shared_ptr<const TokenTrie> trie, size_t max_entries = 16);
  // `preserved` (sorted): control tokens matched by their text (TokenTrie::build); each distinct set
  // has its own trie (a format's markers: one or two sets per model in practice). `prepared`: an
  // automaton from prepare() for the same grammar, adopted when the cache has none.
  std::shared_ptr<GrammarAutomaton> get(const std::shared_ptr<const Grammar>& g, const std::vector<int32_t>& preserved = {},
                                        std::shared_ptr<GrammarAutomaton> prepared = nullptr);
  const TokenTrie& trie();
  // Any thread: the trie for a preserved set (built once; immutable, shareable).
  std::shared_ptr<const TokenTrie> trie_for(const std::vector<int32_t>& preserved);
  // Any thread (the submitting one): a new automaton for g with its windows precomputed
  // (GrammarAutomaton::precompute) and its start state's token mask computed, so that neither is
  // paid on the engine thread. The automaton must then be handed to get() only. nullptr when the
  // cache already holds an automaton for g (get() will use it; nothing to pay).
  std::shared_ptr<GrammarAutomaton> prepare(const std::shared_ptr<const Grammar>& g, const std::vector<int32_t>& preserved);

 private:
  const tokenizer::Tokenizer* tok_ = nullptr;
  std::vector<int32_t> eog_;
  int64_t n_vocab_ = 0;
  size_t max_entries_;
  std::mutex trie_mu_;  // trie_ and preserved_tries_ (trie_for, prepare: any thread)
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<std::pair<std::vector<int32_t>, std::shared_ptr<const TokenTrie>>> preserved_tries_;
  struct Entry {
    std::shared_ptr<GrammarAutomaton> a;
    uint64_t last_used = 0;
  };
  std::string key(const Grammar& g, const std::vector<int32_t>& preserved) const;
  std::mutex entries_mu_;  // entries_ (get: engine thread; prepare: any thread, looks only)
  std::unordered_map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace kiln::engine
