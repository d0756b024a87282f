// PrefixCache tests (no model): payloads are made-up bytes that encode (token, position), so the
// test can check that what a match returns is exactly the rows / states that were inserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>

#include "engine/prefix_cache.h"

using namespace kiln::engine;

namespace {

constexpr size_t kRow = 8;  // payload bytes per position: token, position

// The "slot memory" of a sequence: row p = {tokens[p], p}.
PrefixCache::KvReader reader(const std::vector<int32_t>& toks) {
  return [&toks](int64_t p0, int64_t n, uint8_t* out) {
    for (int64_t p = p0; p < p0 + n; ++p) {
      const int32_t t = toks[size_t(p)], pp = int32_t(p);
      std::memcpy(out + size_t(p - p0) * kRow, &t, 4);
      std::memcpy(out + size_t(p - p0) * kRow + 4, &pp, 4);
    }
  };
}

// Checks that the pieces reproduce rows [0, m.n_tokens) of `toks`.
void expect_rows(const PrefixCache::Match& m, const std::vector<int32_t>& toks) {
  int64_t covered = 0;
  for (const auto& pc : m.pieces) {
    ASSERT_EQ(pc.pos0, covered);
    for (int64_t r = 0; r < pc.rows && pc.pos0 + r < m.n_tokens; ++r) {
      int32_t t, p;
      std::memcpy(&t, pc.kv + size_t(r) * kRow, 4);
      std::memcpy(&p, pc.kv + size_t(r) * kRow + 4, 4);
      EXPECT_EQ(p, pc.pos0 + r);
      EXPECT_EQ(t, toks[size_t(pc.pos0 + r)]) << "row " << pc.pos0 + r;
    }
    covered = pc.pos0 + pc.rows;
  }
  EXPECT_GE(covered, m.n_tokens);
}

std::vector<int32_t> seq(int n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = start + i;
  return v;
}

std::vector<float> state_of(const std::vector<int32_t>& toks) {  // a "recurrent state": f(prefix)
  float h = 0;
  for (int32_t t : toks) h = std::fmod(h * 31.f + float(t), 65521.f);
  return {h, float(toks.size())};
}

// A state to insert, read from host floats (caches without spare slots never call save).
const PrefixCache::StateSource* src(const std::vector<float>& v) {
  static std::deque<PrefixCache::StateSource> keep;
  keep.push_back({[v](float* out) { std::copy(v.begin(), v.end(), out); },
                  [](int) { ADD_FAILURE() << "save() on a cache without spare state slots"; }});
  return &keep.back();
}

PrefixCacheOptions attn_opts(int block = 4, int64_t ram = -1) {
  PrefixCacheOptions o;
  o.block = block;
  o.ram_bytes = ram;
  o.kv_bytes_per_pos = kRow;
  return o;
}

PrefixCacheOptions hybrid_opts(int block = 4, int64_t ram = -1) {
  PrefixCacheOptions o = attn_opts(block, ram);
  o.recurrent = true;
  o.rec_floats = 2;
  return o;
}

}  // namespace

TEST(EnginePrefixCache, AttentionReusesBlocksAndPartialRows) {
  PrefixCache c(attn_opts());
  auto a = seq(10, 100);  // blocks [0,4) [4,8), tail [8,10)
  c.insert(a, reader(a), nullptr, true);
  EXPECT_EQ(c.stats().n_nodes, 2);
  EXPECT_EQ(c.stats().n_tails, 1);
  // Same prompt: everything but the last token.
  auto m = c.match(a, int64_t(a.size()) - 1);
  EXPECT_EQ(m.n_tokens, 9);
  expect_rows(m, a);
  // Diverging inside the second block: partial rows of the child.
  auto b = a;
  b[6] = 999;
  m = c.match(b, int64_t(b.size()) - 1);
  EXPECT_EQ(m.n_tokens, 6);
  expect_rows(m, b);
  // Diverging at the very first token: nothing.
  auto d = a;
  d[0] = 5;
  EXPECT_EQ(c.match(d, 9).n_tokens, 0);
  // Longer prompt extending the sequence: the whole inserted sequence.
  auto e = a;
  for (int i = 0; i < 7; ++i) e.push_back(7 + i);
  m = c.match(e, int64_t(e.size()) - 1);
  EXPECT_EQ(m.n_tokens, 10);
  expect_rows(m, e);
}

TEST(EnginePrefixCache, HybridNeedsAStateAtTheMatchEnd) {
  PrefixCache c(hybrid_opts());
  auto a = seq(10, 100);
  // Blocks only (no state): nothing reusable for a hybrid model.
  c.insert(std::span<const int32_t>(a).first(8), reader(a), nullptr, false);
  EXPECT_EQ(c.match(a, 9).n_tokens, 0);
  // A state at 8 (block-aligned: on the node).
  auto s8 = state_of(std::vector<int32_t>(a.begin(), a.begin() + 8));
  c.insert(std::span<const int32_t>(a).first(8), reader(a), src(s8), false);
  auto m = c.match(a, 9);
  ASSERT_EQ(m.n_tokens, 8);
  ASSERT_NE(m.rec, nullptr);
  EXPECT_EQ(std::vector<float>(m.rec, m.rec + 2), s8);
  expect_rows(m, a);
  // A state at the end (10, a tail) — only usable when max_len allows it.
  auto s10 = state_of(a);
  c.insert(a, reader(a), src(s10), false);
  EXPECT_EQ(c.match(a, 9).n_tokens, 8);
  auto e = a;
  e.push_back(1);
  e.push_back(2);
  m = c.match(e, 11);
  ASSERT_EQ(m.n_tokens, 10);
  EXPECT_EQ(std::vector<float>(m.rec, m.rec + 2), s10);
  expect_rows(m, e);
  // Diverging inside the tail: back to the node's state at 8 (no partial states).
  auto f = a;
  f[9] = 77;
  f.push_back(3);
  m = c.match(f, 10);
  EXPECT_EQ(m.n_tokens, 8);
  EXPECT_EQ(std::vector<float>(m.rec, m.rec + 2), s8);
  EXPECT_EQ(c.stats().n_states, 2);
}

// shared_prefix: how far a prompt follows what is cached, states or not (full blocks, then the common
// beginning of a child block or a tail).
TEST(EnginePrefixCache, SharedPrefixIgnoresStates) {
  PrefixCache c(hybrid_opts());
  auto a = seq(10, 100);
  EXPECT_EQ(c.shared_prefix(a), 0);
  c.insert(a, reader(a), nullptr, true);  // blocks [0, 8) and a 2-token tail, no state
  EXPECT_EQ(c.match(a, 10).n_tokens, 0);
  EXPECT_EQ(c.shared_prefix(a), 10);
  auto b = a;
  b[9] = 7;  // leaves inside the tail
  EXPECT_EQ(c.shared_prefix(b), 9);
  auto d = a;
  d[5] = 7;  // leaves inside the second block
  EXPECT_EQ(c.shared_prefix(d), 5);
  d[0] = 7;
  EXPECT_EQ(c.shared_prefix(d), 0);
  auto e = a;
  e.insert(e.end(), {1, 2, 3, 4, 5, 6});  // continues past everything cached
  EXPECT_EQ(c.shared_prefix(e), 10);
}

TEST(EnginePrefixCache, SharedPrefixStoredOnce) {
  PrefixCache c(attn_opts(4));
  auto sys = seq(16, 500);
  for (int u = 0; u < 5; ++u) {
    auto p = sys;
    for (int i = 0; i < 8; ++i) p.push_back(u * 10 + i);
    c.insert(p, reader(p), nullptr, false);
  }
  // 4 shared blocks + 2 private blocks for each of 5 users.
  EXPECT_EQ(c.stats().n_nodes, 4 + 5 * 2);
  auto q = sys;
  q.push_back(9999);
  q.push_back(9998);
  auto m = c.match(q, int64_t(q.size()) - 1);
  EXPECT_EQ(m.n_tokens, 16);
  expect_rows(m, q);
}

TEST(EnginePrefixCache, LruEvictionKeepsTheBoundAndRecentEntries) {
  // Each block costs 4*8 payload + 16 key + overhead; allow roughly 6 blocks.
  PrefixCache probe(attn_opts(4));
  auto one = seq(4, 0);
  probe.insert(one, reader(one), nullptr, false);
  const int64_t per_block = probe.stats().bytes;
  PrefixCache c(attn_opts(4, per_block * 6));
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 6; ++i) seqs.push_back(seq(8, 1000 * (i + 1)));  // 2 blocks each
  for (auto& s : seqs) {
    c.insert(s, reader(s), nullptr, false);
    EXPECT_LE(c.stats().bytes, per_block * 6);
  }
  EXPECT_GT(c.stats().evictions, 0);
  // The most recent three sequences are intact, the oldest are gone.
  for (int i = 3; i < 6; ++i) EXPECT_EQ(c.match(seqs[size_t(i)], 8).n_tokens, 8) << i;
  EXPECT_EQ(c.match(seqs[0], 8).n_tokens, 0);
  // Touching an old entry protects it: use seqs[3], insert another, seqs[4] goes first.
  (void)c.match(seqs[3], 8);
  auto extra = seq(8, 90000);
  c.insert(extra, reader(extra), nullptr, false);
  EXPECT_EQ(c.match(seqs[3], 8).n_tokens, 8);
  EXPECT_LT(c.match(seqs[4], 8).n_tokens, 8);
}

TEST(EnginePrefixCache, HybridEvictionDropsStatelessBranches) {
  PrefixCache probe(hybrid_opts(4));
  auto one = seq(4, 0);
  auto s1 = state_of(one);
  probe.insert(one, reader(one), src(s1), false);
  const int64_t unit = probe.stats().bytes;
  PrefixCache c(hybrid_opts(4, unit * 5));
  // Sequence of 12 tokens with a state only at its end; then a second, unrelated one evicts it.
  auto a = seq(12, 10);
  auto sa = state_of(a);
  c.insert(a, reader(a), src(sa), false);
  EXPECT_EQ(c.stats().n_nodes, 3);
  auto b = seq(12, 5000);
  auto sb = state_of(b);
  c.insert(b, reader(b), src(sb), false);
  EXPECT_LE(c.stats().bytes, unit * 5);
  // a's last block (holding its only state) went first; its now stateless ancestors went with it
  // instead of occupying the budget.
  auto m = c.match(a, 12);
  EXPECT_EQ(m.n_tokens, 0);
  auto mb = c.match(b, 12);
  EXPECT_EQ(mb.n_tokens, 12);
  EXPECT_EQ(std::vector<float>(mb.rec, mb.rec + 2), sb);
  EXPECT_EQ(c.stats().n_nodes, 3);
}

// A state that moves to RAM takes the host buffer of one evicted before it (no fresh allocation and
// page faults on a busy server, where each added state evicts an old one); the contents are its own.
TEST(EnginePrefixCache, RamStatesReuseEvictedBuffers) {
  PrefixCacheOptions o = hybrid_opts(4);
  o.rec_floats = 1024;  // large enough that a reused buffer is not a coincidence of the allocator
  auto state = [](const std::vector<int32_t>& t) {
    std::vector<float> v(1024);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(t[0]) + float(i);
    return v;
  };
  // Bound: two prompts' entries (6 tokens: one block + a 2-token tail with the state).
  {
    PrefixCache probe(o);
    const auto s = seq(6, 10);
    probe.insert(s, reader(s), src(state(s)), false);
    o.ram_bytes = 2 * probe.stats().bytes + 16;
  }
  PrefixCache c(o);
  std::vector<const float*> bufs;
  for (int k = 0; k < 6; ++k) {
    const auto s = seq(6, 100 * (k + 1));
    c.insert(s, reader(s), src(state(s)), false);
    EXPECT_LE(c.stats().bytes, o.ram_bytes);
    auto q = s;
    q.push_back(7);
    const auto m = c.match(q, 6);
    ASSERT_EQ(m.n_tokens, 6) << k;
    ASSERT_NE(m.rec, nullptr);
    EXPECT_EQ(std::vector<float>(m.rec, m.rec + 1024), state(s)) << k;
    bufs.push_back(m.rec);
  }
  // From the fourth insert on, each new state lands in a buffer an earlier (evicted) one held.
  for (size_t k = 3; k < bufs.size(); ++k)
    EXPECT_NE(std::find(bufs.begin(), bufs.begin() + std::ptrdiff_t(k), bufs[k]), bufs.begin() + std::ptrdiff_t(k)) << k;
}

TEST(EnginePrefixCache, DisabledCacheMatchesNothing) {
  PrefixCache c(attn_opts(4, 0));
  auto a = seq(12, 1);
  c.insert(a, reader(a), nullptr, true);
  EXPECT_EQ(c.match(a, 11).n_tokens, 0);
  EXPECT_EQ(c.stats().bytes, 0);
}

// Random sequences sharing random prefixes: every match must be a true common prefix with some
// inserted sequence and reproduce its rows; attention-only matches are the longest such prefix.
TEST(EnginePrefixCache, RandomisedAgainstBruteForce) {
  std::mt19937 g(9);
  for (int block : {1, 3, 8}) {
    PrefixCache c(attn_opts(block));
    std::vector<std::vector<int32_t>> inserted;
    for (int it = 0; it < 60; ++it) {
      std::vector<int32_t> s;
      if (!inserted.empty() && g() % 3) {
        const auto& base = inserted[g() % inserted.size()];
        s.assign(base.begin(), base.begin() + std::ptrdiff_t(g() % (base.size() + 1)));
      }
      const int extra = 1 + int(g() % 20);
      for (int i = 0; i < extra; ++i) s.push_back(int32_t(g() % 4));
      // query first
      const int64_t max_len = int64_t(s.size()) - 1;
      auto m = c.match(s, max_len);
      int64_t oracle = 0;
      for (const auto& b : inserted) {
        int64_t k = 0;
        while (k < int64_t(b.size()) && k < int64_t(s.size()) && b[size_t(k)] == s[size_t(k)]) ++k;
        oracle = std::max(oracle, std::min(k, max_len));
      }
      EXPECT_EQ(m.n_tokens, oracle) << "block " << block << " iteration " << it;
      expect_rows(m, s);
      c.insert(s, reader(s), nullptr, true);
      inserted.push_back(s);
    }
  }
}

// The first tier: spare state slots (here plain vectors). New states take free slots; with none
// free the least recently used slot's state moves to RAM (read through read_dev) and its slot is
// reused; every match returns the state inserted for its prefix, from a slot or from RAM; evicted
// entries give their slots back; clear() frees every slot.
TEST(EnginePrefixCache, SpareSlotsFirstThenRam) {
  std::vector<std::vector<float>> slots(2, std::vector<float>(2, -1.f));
  int reads = 0;
  PrefixCacheOptions o = hybrid_opts(4);
  o.n_dev_states = 2;
  o.read_dev = [&](int i, float* out) {
    ++reads;
    std::copy(slots.at(size_t(i)).begin(), slots.at(size_t(i)).end(), out);
  };
  PrefixCache c(o);
  std::deque<PrefixCache::StateSource> keep;
  int saves = 0, host_reads = 0;
  auto source = [&](const std::vector<float>& v) {
    keep.push_back({[&host_reads, v](float* out) { ++host_reads, std::copy(v.begin(), v.end(), out); },
                    [&slots, &saves, v](int i) { ++saves, slots.at(size_t(i)) = v; }});
    return &keep.back();
  };
  // Three prompts with states at their ends (tails: 6 tokens, block 4).
  std::vector<std::vector<int32_t>> p = {seq(6, 100), seq(6, 200), seq(6, 300)};
  for (const auto& s : p) c.insert(s, reader(s), source(state_of(s)), false);
  EXPECT_EQ(saves, 3);       // every state went to a slot ...
  EXPECT_EQ(host_reads, 0);  // ... none was read from the sequence to the host
  EXPECT_EQ(reads, 1);       // the oldest (p[0]'s) moved to RAM to free its slot
  PrefixCacheStats st = c.stats();
  EXPECT_EQ(st.n_states, 3);
  EXPECT_EQ(st.n_dev_states, 2);
  for (size_t i = 0; i < p.size(); ++i) {
    auto q = p[i];
    q.push_back(7);
    const auto m = c.match(q, int64_t(q.size()) - 1);
    ASSERT_EQ(m.n_tokens, 6) << i;
    const std::vector<float> got = m.rec_dev >= 0 ? slots[size_t(m.rec_dev)] : std::vector<float>(m.rec, m.rec + 2);
    EXPECT_EQ(got, state_of(p[i])) << i;
    EXPECT_EQ(m.rec_dev >= 0, i > 0) << i;  // p[0]'s state is the one in RAM
    expect_rows(m, q);
  }
  // A fourth state: the least recently used slot now is p[1]'s (p[2] was matched after it).
  const auto d = seq(6, 400);
  c.insert(d, reader(d), source(state_of(d)), false);
  EXPECT_EQ(reads, 2);
  auto q1 = p[1];
  q1.push_back(7);
  EXPECT_EQ(c.match(q1, 6).rec_dev, -1);
  c.clear();
  EXPECT_EQ(c.stats().n_states, 0);
  for (int k = 0; k < 2; ++k) {
    const auto s = seq(6, 500 + 100 * k);
    c.insert(s, reader(s), source(state_of(s)), false);
  }
  EXPECT_EQ(c.stats().n_dev_states, 2);  // both slots free again after clear()
  EXPECT_EQ(reads, 2);
  // A RAM bound that holds one prompt's blocks: the evicted entries give their slots back, so
  // later states take them without moving anything to RAM.
  o.ram_bytes = 400;
  PrefixCache small(o);
  for (int k = 0; k < 5; ++k) {
    const auto s = seq(6, 1000 + 100 * k);
    small.insert(s, reader(s), source(state_of(s)), false);
    EXPECT_LE(small.stats().bytes, 400);
  }
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(small.stats().n_states, 1);
  EXPECT_EQ(small.stats().n_dev_states, 1);
}
