// model/gen/synth.h — the generators' shared weight synthesis (internal to src/model/gen).
// Owns: the seeded RNG (splitmix64 seeding + xoshiro256**, bounded Irwin-Hall normals), the
//   per-tensor / per-row seed derivation, and the float-row -> GGUF-type encoding. Both the text
//   model generator (generator.cpp) and the projector generator (mmproj.cpp) draw every value
//   through these, so their files are a pure function of (spec, types, seed).
//   planned_tensors: a definition list's plan; add_random_tensors: every tensor of a definition list added to a gguf::Writer, rows synthesised
//   on a thread pool when the writer asks for them (or, fast, assembled from a few synthesised rows' blocks).
// Must not: know tensor names or architectures.
// Threading: plain functions; an Rng belongs to one thread (one per row).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "gguf/writer.h"
#include "model/gen/gen.h"

#include "core/fp16.h"
#include "gguf/types.h"
#include "tensor/quant.h"

namespace kiln::model::gen {

inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& v : s) v = splitmix64(seed);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t r = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  // Irwin-Hall(4) rescaled to unit variance: a bounded (|x| < 3.47), smooth normal approximation.
  float normal() {
    const uint64_t r = next();
    const float sum = float(r & 0xffff) + float((r >> 16) & 0xffff) + float((r >> 32) & 0xffff) + float(r >> 48);
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }
};

inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stream of one tensor's values: a function of the file's seed and the tensor's name.
inline uint64_t tensor_seed(uint64_t seed, std::string_view name) { return seed * 0x9e3779b97f4a7c15ull ^ fnv1a(name); }
// The RNG of one row: every row has its own stream, so the bytes depend on neither chunking nor threads.
inline Rng row_rng(uint64_t tseed, int64_t row) {
  uint64_t sm = tseed ^ (uint64_t(row) * 0xd1b54a32d192ed03ull);
  return Rng(splitmix64(sm));
}

// One row of n floats in type t (float types converted, others through kiln's reference quantizers).
inline void encode_row(gguf::GgmlType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case gguf::GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case gguf::GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    case gguf::GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    default: tensor::quantize_row(t, src, dst, n); break;
  }
}

// The plan of a definition list (each with .name, .type, .ne): names, types, shapes and bytes.
template <class Def>
std::vector<PlannedTensor> planned_tensors(const std::vector<Def>& defs) {
  std::vector<PlannedTensor> out;
  for (const auto& d : defs) {
    uint64_t rows = 1;
    for (size_t i = 1; i < d.ne.size(); ++i) rows *= uint64_t(d.ne[i]);
    out.push_back({d.name, d.type, d.ne, rows * tensor::row_size(d.type, d.ne[0])});
  }
  return out;
}

// Adds every tensor of defs (each with .name, .type, .ne) to w; when w writes a chunk of rows, each row
// is drawn by fill_row(def, rng, buf, n) from its own RNG stream (row_rng of the tensor's seed: the bytes
// depend on neither chunking nor threads) and encoded to the tensor's type, on n_threads threads.
// pool_rows > 0 (GenOptions::fast): only a tensor's first pool_rows rows are drawn so; every later row
// is assembled from their whole blocks (block b of row r from pool row hash(r, b) % pool_rows): valid
// blocks of the same distribution, written at copy speed, for runs where only sizes matter.
template <class Def, class FillRow>
Status add_random_tensors(gguf::Writer& w, std::shared_ptr<const std::vector<Def>> defs, uint64_t seed, int n_threads,
                          FillRow fill_row, int64_t pool_rows = 0) {
  auto pool = std::make_shared<ThreadPool>(n_threads);
  for (size_t ti = 0; ti < defs->size(); ++ti) {
    const Def& d = (*defs)[ti];
    const uint64_t tseed = tensor_seed(seed, d.name);
    const uint64_t row_bytes = tensor::row_size(d.type, d.ne[0]);
    auto draw = [defs, ti, tseed, row_bytes, pool, fill_row](int64_t row0, int64_t n_rows, uint8_t* dst) {
      const Def& t = (*defs)[ti];
      const int64_t n = t.ne[0];
      pool->parallel_for(n_rows, [&](int64_t b, int64_t e, int) {
        std::vector<float> buf(static_cast<size_t>(n));
        for (int64_t r = b; r < e; ++r) {
          Rng rng = row_rng(tseed, row0 + r);
          fill_row(t, rng, buf.data(), n);
          encode_row(t.type, buf.data(), dst + uint64_t(r) * row_bytes, n);
        }
      });
    };
    if (pool_rows <= 0) {
      KILN_TRY(w.add_tensor(d.name, d.type, d.ne, draw));
      continue;
    }
    // The writer asks for one tensor's chunks in order from one thread: the pool is drawn at the first.
    auto rows = std::make_shared<std::vector<uint8_t>>();
    const uint64_t blk = gguf::type_info(d.type).type_size;
    const int64_t nblk = d.ne[0] / int64_t(gguf::type_info(d.type).block_size);
    int64_t n_total = 1;
    for (size_t i = 1; i < d.ne.size(); ++i) n_total *= d.ne[i];
    auto fill = [draw, rows, pool, pool_rows, row_bytes, blk, nblk, tseed, n_total](int64_t row0, int64_t n_rows,
                                                                                     uint8_t* dst) {
      const int64_t own = std::clamp<int64_t>(pool_rows - row0, 0, n_rows);  // rows of the pool itself
      if (own > 0) draw(row0, own, dst);
      if (own == n_rows) return;
      if (rows->empty()) {
        rows->resize(size_t(pool_rows) * row_bytes);
        draw(0, pool_rows, rows->data());
      }
      pool->parallel_for(n_rows - own, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t r = row0 + own + i;
          uint8_t* out = dst + uint64_t(own + i) * row_bytes;
          uint64_t h = tseed ^ (uint64_t(r) * 0x9e3779b97f4a7c15ull);
          for (int64_t k = 0; k < nblk; ++k)
            std::memcpy(out + uint64_t(k) * blk, rows->data() + (splitmix64(h) % uint64_t(pool_rows)) * row_bytes + uint64_t(k) * blk,
                        blk);
        }
      });
      if (row0 + n_rows == n_total) std::vector<uint8_t>().swap(*rows);  // the tensor's last chunk
    };
    KILN_TRY(w.add_tensor(d.name, d.type, d.ne, fill));
  }
  return Status{};
}

}  // namespace kiln::model::gen
