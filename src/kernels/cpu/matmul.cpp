// kernels/cpu/matmul.cpp — the dispatched, multi-threaded mat-mul of kernels/ops.h (matmul, its
//   workspace, get_rows): which table entry takes a call (float / integer 1-4-column / 8-row
//   decode / tile paths), activation quantization, and the row schedule.
// Threading: splits weight rows across the pool (dynamic schedule); never the columns.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/op_profile.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace kiln::kernels {

using cpu::Table;

namespace {
inline size_t align64(size_t x) { return (x + 63) & ~size_t(63); }
constexpr int64_t kRowTile = 16;  // weight rows kept hot while sweeping the columns of X
bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
// Per-thread scratch of the quantized paths: kRowTile dequantized rows, or one decoded tile.
size_t thread_scratch(int64_t k) { return align64(std::max(size_t(kRowTile * k) * 4, cpu::tile_scratch_bytes(k))); }
// Fewest columns for which matmul takes the tile path (Table::tile_mm); below, the 1..4-column
// kernels (the same bits). KILN_TILE_MIN_COLS overrides (0: never).
int64_t tile_min_cols() {
  static const int64_t v = [] {
    const char* e = std::getenv("KILN_TILE_MIN_COLS");
    return e && *e ? int64_t(std::atoll(e)) : int64_t(8);
  }();
  return v;
}
// Whether the environment turns a speed-comparison switch off (NAME=0).
bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '0';
}
// Whether one-column calls take the 8-row decode kernels (Table::vec_dot_q8_r8; the same bits as
// vec_dot_q8). KILN_DECODE_R8=0 turns them off (speed comparisons only).
bool decode_r8() {
  static const bool v = !env_off("KILN_DECODE_R8");
  return v;
}
// Whether calls of 2..kMaxCols columns take the 8-row kernels too: the several-column entry
// (Table::vec_dot_q8_r8_cols) where the type has one, else for two columns the one-column kernel
// once per column over the same 8 rows, their blocks in L1 for the second (the 0.8B shape's output
// matrix at 2 threads: 18-43 % faster than vec_dot_q8 for every type without a several-column
// kernel; at 3-4 columns no faster). KILN_DECODE_R8_COLS=0: vec_dot_q8 for every call of 2+ columns
// (speed comparisons only; the same bits).
bool r8_cols() {
  static const bool v = !env_off("KILN_DECODE_R8_COLS");
  return v;
}
// Weight rows per chunk of matmul's dynamic schedule (ThreadPool::parallel_for_dynamic): about
// kChunkBytes of weight rows times columns (a few microseconds of work, so a thread kept off its core
// by another process leaves little behind), whole grains, and at least 4 chunks per thread.
int64_t chunk_rows(int64_t n, size_t w_stride, int64_t m, int64_t grain, int n_threads) {
  constexpr size_t kChunkBytes = size_t(32) << 10;
  const int64_t by_cost = int64_t(kChunkBytes / std::max<size_t>(1, w_stride * size_t(std::max<int64_t>(1, m))));
  const int64_t by_count = (n + 4 * n_threads - 1) / (4 * n_threads);
  const int64_t rows = std::max<int64_t>(1, std::min(by_cost, by_count));
  return (rows + grain - 1) / grain * grain;
}
// The tile path's column side data in the workspace: only for calls that take the tile path (so
// workspaces of smaller batches are what they were without it).
size_t side_region(GgmlType wt, int64_t k, int64_t m) {
  return tile_min_cols() > 0 && m >= tile_min_cols() ? align64(size_t(m) * cpu::tile_side_bytes(wt, k)) : 0;
}
}  // namespace

size_t matmul_workspace(GgmlType wt, int64_t k, int64_t m, int n_threads) {
  if (is_float_type(wt)) {
    // ggml's order (AVX-512 tables): X rounded to F16 / BF16 per column. Other tables: kRowTile
    // converted weight rows per thread when m > 1. One call uses one of the two.
    const size_t half = wt == GgmlType::F32 ? 0 : size_t(m) * align64(size_t(k) * 2);
    const size_t tiles = m == 1 ? 0 : size_t(n_threads) * align64(size_t(kRowTile * k) * 4);
    return std::max(half, tiles);
  }
  // Quantized activations for every column, their tile side data, + per thread kRowTile dequantized
  // rows (float path) or one decoded tile (tile path).
  return align64(size_t(m) * cpu::act_bytes(cpu::act_type(wt), k)) + side_region(wt, k, m) +
         size_t(n_threads) * thread_scratch(k);
}

namespace {
// KILN_CPU_PROFILE (core/op_profile.h): pool.parallel_for_dynamic(n, fn, grain, chunk), timed as
// the phase label() with the threads' busy time when profiling, else just the call.
template <class L, class F>
void sweep(ThreadPool& pool, L&& label, int64_t n, F&& fn, int64_t grain, int64_t chunk) {
  if (!op_profile::on()) {
    pool.parallel_for_dynamic(n, fn, grain, chunk);
    return;
  }
  std::vector<double> busy(size_t(pool.size()), 0.0);
  const auto t0 = op_profile::Clock::now();
  pool.parallel_for_dynamic(n, [&](int64_t j0, int64_t j1, int tid) {
    const auto c0 = op_profile::Clock::now();
    fn(j0, j1, tid);
    busy[size_t(tid)] += op_profile::ms_since(c0);
  }, grain, chunk);
  double b = 0;
  for (double v : busy) b += v;
  op_profile::add(label(), op_profile::ms_since(t0), 0, b, pool.size());
}
// Times body() as the phase label() when profiling.
template <class L, class B>
void phase(L&& label, B&& body) {
  if (!op_profile::on()) {
    body();
    return;
  }
  const auto t0 = op_profile::Clock::now();
  body();
  op_profile::add(label(), op_profile::ms_since(t0));
}
std::string mm_label(const char* what, const MatmulArgs& a) {
  return std::string("  mm ") + what + " " + std::string(gguf::type_name(a.wt)) + " " + std::to_string(a.k) + "x" + std::to_string(a.n) +
         " m" + std::to_string(a.m);
}
// X's columns through conv (an activation quantizer / F16-BF16 rounding) into out, stride bytes
// apart; in parallel only when there are enough columns to be worth it.
void convert_columns(const MatmulArgs& a, cpu::QuantizeActFn conv, uint8_t* out, size_t stride, ThreadPool& pool) {
  auto cols = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) conv(a.x + t * a.x_stride, a.k, out + size_t(t) * stride);
  };
  if (a.m < 2 * pool.size()) cols(0, a.m, 0);
  else pool.parallel_for(a.m, cols);
}
}  // namespace

void matmul(const MatmulArgs& a, void* ws, ThreadPool& pool) {
  KILN_CHECK(matmul_supported(a.wt), "matmul: unsupported weight type {}", gguf::type_name(a.wt));
  KILN_CHECK(a.m == 1 || (a.x_stride >= a.k && a.y_stride >= a.n), "matmul: bad strides");
  KILN_CHECK(a.k % int64_t(gguf::type_info(a.wt).block_size) == 0, "matmul: k {} is not whole {} blocks", a.k,
             gguf::type_name(a.wt));
  KILN_CHECK(a.w_stride >= gguf::type_info(a.wt).type_size * size_t(a.k / gguf::type_info(a.wt).block_size),
             "matmul: weight row stride {} shorter than a row", a.w_stride);
  const Table& T = cpu::table();
  const int wi = cpu::type_index(a.wt);
  const auto* w = static_cast<const char*>(a.w);
  const int64_t k = a.k, m = a.m;

  if (const cpu::FloatMmFn fmm = is_float_type(a.wt) ? T.ggml_float_mm[wi] : nullptr) {
    // ggml's float mat-mul (AVX-512 tables): X in the weight type's ggml vec_dot_type, tinyBLAS's
    // order for weights of 4k rows (llama.cpp's order for >= 2 columns, taken here for every column
    // count: batch invariance), else ggml_vec_dot's. 4 rows x 4 columns per kernel call.
    const cpu::QuantizeActFn conv = T.ggml_float_act[wi];
    const uint8_t* act = reinterpret_cast<const uint8_t*>(a.x);
    size_t as = size_t(a.x_stride) * sizeof(float);
    if (conv) {
      KILN_CHECK(ws != nullptr, "matmul: {} weights need a workspace", gguf::type_name(a.wt));
      auto* buf = static_cast<uint8_t*>(ws);
      as = align64(size_t(k) * 2);
      convert_columns(a, conv, buf, as, pool);
      act = buf;
    }
    const bool rows4 = a.n % 4 == 0 && !a.expert;
    sweep(pool, [&] { return mm_label("float", a); }, a.n, [&](int64_t j0, int64_t j1, int) {
      for (int64_t jb = j0; jb < j1; jb += kRowTile) {
        const int64_t je = std::min(j1, jb + kRowTile);
        for (int64_t t = 0; t < m; t += cpu::kMaxCols) {
          const int nc = int(std::min<int64_t>(cpu::kMaxCols, m - t));
          for (int64_t j = jb; j < je; j += 4)
            fmm(k, w + size_t(j) * a.w_stride, a.w_stride, int(std::min<int64_t>(4, je - j)), act + size_t(t) * as, as, nc,
                rows4, a.y + t * a.y_stride + j, a.y_stride);
        }
      }
    }, 4, chunk_rows(a.n, a.w_stride, m, 4, pool.size()));
    return;
  }
  if (is_float_type(a.wt) && m == 1) {
    const cpu::DotRowFn dot = T.dot_row[wi];
    pool.parallel_for_dynamic(a.n, [&](int64_t j0, int64_t j1, int) {
      for (int64_t j = j0; j < j1; ++j) a.y[j] = dot(w + size_t(j) * a.w_stride, a.x, k);
    }, 4, chunk_rows(a.n, a.w_stride, m, 4, pool.size()));
    return;
  }
  KILN_CHECK(ws != nullptr, "matmul: {} weights with m = {} need a workspace", gguf::type_name(a.wt), m);
  const GgmlType at = cpu::act_type(a.wt);
  const cpu::QuantizeActFn qa = T.quantize_act[cpu::type_index(at)];
  // float weights: at is F32, no qa. A weight's row count picks the kernel, never the batch.
  cpu::VecDotQ8Fn vd = qa ? T.vec_dot_q8[wi] : nullptr;
  if (qa && a.n % 8 != 0 && T.vec_dot_q8_rows_not8[wi]) vd = T.vec_dot_q8_rows_not8[wi];
  else if (qa && a.expert && T.vec_dot_q8_expert[wi]) vd = T.vec_dot_q8_expert[wi];
  const cpu::VecDotQ8RowsFn r8 = vd && vd == T.vec_dot_q8[wi] && decode_r8() ? T.vec_dot_q8_r8[wi] : nullptr;
  const bool r8_multi = r8 && r8_cols();  // 2+ columns through the 8-row kernels
  const cpu::VecDotQ8RowsColsFn r8c = r8_multi ? T.vec_dot_q8_r8_cols[wi] : nullptr;
  if (vd) {
    KILN_CHECK(k % 32 == 0, "matmul: k {} not a multiple of 32", k);
    auto* act = static_cast<uint8_t*>(ws);
    const size_t ab = cpu::act_bytes(at, k);
    phase([&] { return std::string("  mm quantize ") + std::string(gguf::type_name(at)) + " k" + std::to_string(k) + " m" + std::to_string(m); },
          [&] { convert_columns(a, qa, act, ab, pool); });
    const cpu::TileMmFn tmm = vd == T.vec_dot_q8[wi] ? T.tile_mm[wi] : nullptr;
    if (tmm && tile_min_cols() > 0 && m >= tile_min_cols()) {
      // Tile path: each thread decodes 16 rows at a time once and multiplies them with every column.
      const size_t sb = cpu::tile_side_bytes(a.wt, k);
      uint8_t* side = act + align64(size_t(m) * ab);
      uint8_t* scratch = side + side_region(a.wt, k, m);
      const cpu::TileSideFn sf = T.tile_side[wi];
      auto sides = [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) sf(k, act + size_t(t) * ab, side + size_t(t) * sb);
      };
      phase([&] { return mm_label("side", a); }, [&] {
        if (m < 2 * pool.size()) sides(0, m, 0);
        else pool.parallel_for(m, sides);
      });
      sweep(pool, [&] { return mm_label("tile", a); }, a.n, [&](int64_t j0, int64_t j1, int tid) {
        cpu::TileMmArgs ta;
        ta.k = k;
        ta.w_stride = a.w_stride;
        ta.act = act;
        ta.act_stride = ab;
        ta.side = side;
        ta.side_stride = sb;
        ta.m = m;
        ta.y_stride = a.y_stride;
        ta.scratch = scratch + size_t(tid) * thread_scratch(k);
        for (int64_t j = j0; j < j1; j += cpu::kTileRows) {
          ta.w = reinterpret_cast<const uint8_t*>(w) + size_t(j) * a.w_stride;
          ta.nr = int(std::min<int64_t>(cpu::kTileRows, j1 - j));
          ta.y = a.y + j;
          tmm(ta);
        }
      }, cpu::kTileRows, chunk_rows(a.n, a.w_stride, m, cpu::kTileRows, pool.size()));
      return;
    }
    // Chunks of whole 8-row groups where the 8-row kernel takes them (n % 8 == 0).
    const int64_t grain = r8 ? 8 : 4;
    sweep(pool, [&] { return mm_label(m == 1 ? "vec" : "cols", a); }, a.n, [&](int64_t j0, int64_t j1, int) {
      for (int64_t jb = j0; jb < j1; jb += kRowTile) {
        const int64_t je = std::min(j1, jb + kRowTile);
        for (int64_t t = 0; t < m; t += cpu::kMaxCols) {
          const int nc = int(std::min<int64_t>(cpu::kMaxCols, m - t));
          const uint8_t* at = act + size_t(t) * ab;
          float out[cpu::kMaxCols];
          int64_t j = jb;
          // 8 rows at once, each output with vd's bits: one column; several with the rows decoded once
          // (r8c); two by column (the rows' blocks in L1 for the second).
          if (r8 && nc == 1) {
            for (; j + 8 <= je; j += 8) r8(k, w + size_t(j) * a.w_stride, a.w_stride, at, a.y + t * a.y_stride + j);
          } else if (r8c) {
            for (; j + 8 <= je; j += 8)
              r8c(k, w + size_t(j) * a.w_stride, a.w_stride, at, ab, nc, a.y + t * a.y_stride + j, a.y_stride);
          } else if (r8_multi && nc == 2) {
            for (; j + 8 <= je; j += 8)
              for (int c = 0; c < nc; ++c)
                r8(k, w + size_t(j) * a.w_stride, a.w_stride, at + size_t(c) * ab, a.y + (t + c) * a.y_stride + j);
          }
          for (; j < je; ++j) {
            vd(k, w + size_t(j) * a.w_stride, at, ab, nc, out);
            for (int c = 0; c < nc; ++c) a.y[(t + c) * a.y_stride + j] = out[c];
          }
        }
      }
    }, grain, chunk_rows(a.n, a.w_stride, m, grain, pool.size()));
    return;
  }
  // Float path: dequantize a tile of weight rows once, dot it with every column.
  auto* rows = static_cast<uint8_t*>(ws) + align64(size_t(m) * cpu::act_bytes(at, k)) + side_region(a.wt, k, m);
  const cpu::ToF32Fn deq = T.to_f32[wi];
  KILN_CHECK(deq != nullptr, "matmul: no dequantizer for {}", gguf::type_name(a.wt));
  pool.parallel_for_dynamic(a.n, [&](int64_t j0, int64_t j1, int tid) {
    float* tile = reinterpret_cast<float*>(rows + size_t(tid) * thread_scratch(k));
    for (int64_t jb = j0; jb < j1; jb += kRowTile) {
      const int64_t je = std::min(j1, jb + kRowTile);
      for (int64_t j = jb; j < je; ++j) deq(w + size_t(j) * a.w_stride, tile + (j - jb) * k, k);
      for (int64_t t = 0; t < m; ++t) {
        const float* xt = a.x + t * a.x_stride;
        for (int64_t j = jb; j < je; ++j) a.y[t * a.y_stride + j] = T.dot_f32(tile + (j - jb) * k, xt, k);
      }
    }
  }, 4, chunk_rows(a.n, a.w_stride, m, 4, pool.size()));
}

void get_rows(GgmlType t, const void* table, size_t row_stride, int64_t n_rows, int64_t k, const int32_t* ids,
              int64_t n, float* out, int64_t out_stride, ThreadPool& pool) {
  const Table& T = cpu::table();
  const cpu::ToF32Fn deq = T.to_f32[cpu::type_index(t)];
  KILN_CHECK(deq != nullptr, "get_rows: unsupported type {}", gguf::type_name(t));
  for (int64_t r = 0; r < n; ++r)
    KILN_CHECK(ids[r] >= 0 && ids[r] < n_rows, "get_rows: id {} out of range [0, {})", ids[r], n_rows);
  pool.parallel_for(n, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      deq(static_cast<const char*>(table) + size_t(ids[r]) * row_stride, out + r * out_stride, k);
  });
}

}  // namespace kiln::kernels
