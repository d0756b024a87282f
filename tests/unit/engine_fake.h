// tests/unit/engine_fake.h — shared by the test_engine_* tests: a fake model (engine::Runner) whose
// logits are a hash of everything the slot's memory holds, so any wrong reuse/restore of KV rows or
// of the "recurrent" state changes the output; and a tokenizer built from the generator's vocabulary.
#pragma once
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/runner.h"
#include "model/gen/gen.h"
#include "tokenizer/tokenizer.h"

namespace kiln::engine::testing {

inline std::unique_ptr<tokenizer::Tokenizer> make_test_tokenizer(int64_t n_vocab = 1024) {
  auto gv = model::gen::build_vocabulary("qwen35", n_vocab);
  KILN_CHECK(gv.ok(), "build_vocabulary");
  tokenizer::Vocab v;
  v.source = "generated";
  v.kind = tokenizer::ModelKind::Bpe;
  v.model_name = gv->model;
  v.pre = gv->pre;
  v.tokens = gv->tokens;
  for (int32_t t : gv->token_type) v.types.push_back(tokenizer::TokenType(t));
  v.merges = gv->merges;
  v.bos = gv->bos;
  v.eos = gv->eos;
  v.eot = gv->eot;
  v.pad = gv->pad;
  v.add_bos = gv->add_bos;
  auto d = tokenizer::bpe_pre_defaults(v.pre);
  if (d) v.clean_spaces = d->clean_spaces;
  auto t = tokenizer::Tokenizer::create(std::move(v));
  KILN_CHECK(t.ok(), "tokenizer: {}", t.ok() ? "" : t.error().message);
  return std::move(*t);
}

inline uint64_t mix64(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h;
}

// KV row of position p: {token, p, 0xA5A5A5A5}. Recurrent state: a 64-bit running hash of the tokens
// fed, as four 16-bit chunks in floats. Logits of a token: uniform in [-3, 3) from
// hash(kv rows [0, p], recurrent state); end-of-generation ids get -100 unless a script forces them.
class FakeRunner final : public Runner {
 public:
  struct Opts {
    int64_t n_vocab = 1024;
    int64_t n_ctx = 512;
    int slots = 4;
    int64_t n_batch = 64;
    bool recurrent = false;
    std::vector<int32_t> suppressed;  // token ids given logit -100 (e.g. EOG)
    int decode_sleep_ms = 0;
    int state_slots = 0;  // spare recurrent state slots (the prefix cache's first tier)
    // Optional: given a slot's tokens (all positions including the current one), a token to force.
    std::function<int32_t(const std::vector<int32_t>&)> script;
  };
  explicit FakeRunner(Opts o) : o_(std::move(o)) {
    kv_.assign(size_t(o_.slots), std::vector<uint8_t>(size_t(o_.n_ctx) * kRow, 0));
    rec_.assign(size_t(o_.slots), std::vector<float>(4, 0.f));
    spare_.assign(size_t(o_.state_slots), std::vector<float>(4, 0.f));
    pos_.assign(size_t(o_.slots), 0);
    logits_.resize(size_t(o_.n_vocab) * size_t(o_.n_batch));
  }

  // Per decode call: list of (slot, n tokens, first position).
  struct RunRec {
    int slot;
    int64_t n;
    int64_t pos0;
  };
  std::vector<std::vector<RunRec>> history() {
    std::lock_guard<std::mutex> lk(mu_);
    return hist_;
  }

  int64_t n_vocab() const override { return o_.n_vocab; }
  int64_t n_ctx() const override { return o_.n_ctx; }
  int n_slots() const override { return o_.slots; }
  int64_t n_batch() const override { return o_.n_batch; }
  bool has_recurrent() const override { return o_.recurrent; }

  Status decode(const model::Batch& b) override {
    if (o_.decode_sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o_.decode_sleep_ms));
    if (b.size() > o_.n_batch) return err("fake: batch {} > n_batch {}", b.size(), o_.n_batch);
    std::vector<RunRec> runs;
    for (int64_t i = 0; i < b.size(); ++i) {
      const int s = b.seq[size_t(i)];
      if (!runs.empty() && runs.back().slot == s) {
        if (b.pos[size_t(i)] != runs.back().pos0 + runs.back().n) return err("fake: positions not consecutive");
        ++runs.back().n;
      } else {
        for (auto& r : runs)
          if (r.slot == s) return err("fake: slot {} in two runs", s);
        runs.push_back({s, 1, b.pos[size_t(i)]});
      }
    }
    for (auto& r : runs) {
      if (r.pos0 > pos_[size_t(r.slot)] || (o_.recurrent && r.pos0 != pos_[size_t(r.slot)]))
        return err("fake: slot {} run at {} but memory holds {}", r.slot, r.pos0, pos_[size_t(r.slot)]);
      if (r.pos0 + r.n > o_.n_ctx) return err("fake: context overflow");
    }
    int64_t out = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      const int s = b.seq[size_t(i)];
      const int64_t p = b.pos[size_t(i)];
      const int32_t t = b.token[size_t(i)];
      if (t < 0 || t >= o_.n_vocab) return err("fake: token {} out of range", t);
      uint8_t* row = kv_[size_t(s)].data() + size_t(p) * kRow;
      const uint32_t fill = 0xA5A5A5A5u;
      std::memcpy(row, &t, 4);
      std::memcpy(row + 4, &p, 4);
      std::memcpy(row + 8, &fill, 4);
      set_rec(s, mix64(get_rec(s), uint64_t(uint32_t(t))));
      pos_[size_t(s)] = p + 1;
      if (b.output[size_t(i)]) fill_logits(s, p, logits_.data() + size_t(out++) * size_t(o_.n_vocab));
    }
    std::lock_guard<std::mutex> lk(mu_);
    hist_.push_back(std::move(runs));
    return {};
  }
  const float* logits(int64_t i) const override { return logits_.data() + size_t(i) * size_t(o_.n_vocab); }
  int64_t seq_pos(int s) const override { return pos_[size_t(s)]; }
  void seq_clear(int s) override {
    pos_[size_t(s)] = 0;
    set_rec(s, 0);
  }
  Status seq_keep(int s, int64_t n) override {
    if (n > pos_[size_t(s)]) return err("fake: keep {} > {}", n, pos_[size_t(s)]);
    if (o_.recurrent && n != pos_[size_t(s)] && n != 0) return err("fake: recurrent rollback");
    if (n == 0) seq_clear(s);
    pos_[size_t(s)] = n;
    return {};
  }
  void set_seq_pos(int s, int64_t n) override { pos_[size_t(s)] = n; }
  size_t kv_bytes_per_pos() const override { return kRow; }
  void read_kv(int s, int64_t p0, int64_t n, uint8_t* out) const override {
    std::memcpy(out, kv_[size_t(s)].data() + size_t(p0) * kRow, size_t(n) * kRow);
  }
  void write_kv(int s, int64_t p0, const uint8_t* in, int64_t rows, int64_t r0, int64_t r1) override {
    std::memcpy(kv_[size_t(s)].data() + size_t(p0 + r0) * kRow, in + size_t(r0) * kRow, size_t(r1 - r0) * kRow);
  }
  size_t rec_floats() const override { return o_.recurrent ? 4 : 0; }
  void read_rec(int s, float* out) const override { std::copy(rec_[size_t(s)].begin(), rec_[size_t(s)].end(), out); }
  void write_rec(int s, const float* in) override { std::copy(in, in + 4, rec_[size_t(s)].begin()); }
  int n_state_slots() const override { return o_.recurrent ? o_.state_slots : 0; }
  void save_rec(int s, int i) override { spare_.at(size_t(i)) = rec_[size_t(s)]; }
  void load_rec(int i, int s) override { rec_[size_t(s)] = spare_.at(size_t(i)); }
  void read_state_slot(int i, float* out) const override { std::copy(spare_.at(size_t(i)).begin(), spare_.at(size_t(i)).end(), out); }

 private:
  static constexpr size_t kRow = 12;
  std::vector<std::vector<float>> spare_;  // Runner::n_state_slots
  uint64_t get_rec(int s) const {
    uint64_t h = 0;
    for (int i = 0; i < 4; ++i) h |= uint64_t(uint16_t(rec_[size_t(s)][size_t(i)])) << (16 * i);
    return h;
  }
  void set_rec(int s, uint64_t h) {
    for (int i = 0; i < 4; ++i) rec_[size_t(s)][size_t(i)] = float((h >> (16 * i)) & 0xFFFF);
  }
  void fill_logits(int s, int64_t p, float* out) const {
    uint64_t h = o_.recurrent ? get_rec(s) : 0x1234;
    std::vector<int32_t> toks;
    for (int64_t q = 0; q <= p; ++q) {
      const uint8_t* row = kv_[size_t(s)].data() + size_t(q) * kRow;
      int32_t t, pp;
      uint32_t fill;
      std::memcpy(&t, row, 4);
      std::memcpy(&pp, row + 4, 4);
      std::memcpy(&fill, row + 8, 4);
      KILN_CHECK(pp == q && fill == 0xA5A5A5A5u, "fake: KV row {} of slot {} is corrupt", q, s);
      h = mix64(h, uint64_t(uint32_t(t)) * 1315423911ull + uint64_t(q));
      toks.push_back(t);
    }
    for (int64_t v = 0; v < o_.n_vocab; ++v)
      out[v] = float(double(mix64(h, uint64_t(v)) >> 11) / double(1ull << 53) * 6.0 - 3.0);
    for (int32_t t : o_.suppressed) out[t] = -100.f;
    if (o_.script) {
      const int32_t f = o_.script(toks);
      if (f >= 0) out[f] = 100.f;
    }
  }

  Opts o_;
  std::vector<std::vector<uint8_t>> kv_;  // per slot [n_ctx, 12 bytes]
  std::vector<std::vector<float>> rec_;   // per slot 4 floats
  std::vector<int64_t> pos_;
  std::vector<float> logits_;             // [n_vocab, n_batch]
  std::mutex mu_;
  std::vector<std::vector<RunRec>> hist_;
};

}  // namespace kiln::engine::testing
