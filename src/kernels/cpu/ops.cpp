// The dispatched, multi-threaded CPU ops of kernels/ops.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/fp16.h"
#include "core/op_profile.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "kernels/ref/ref.h"
#include "tensor/quant.h"

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
// Whether one-column calls take the 8-row decode kernels (Table::vec_dot_q8_r8; the same bits as
// vec_dot_q8). KILN_DECODE_R8=0 turns them off (speed comparisons only).
bool decode_r8() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_DECODE_R8");
    return !(e && e[0] == '0');
  }();
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
          if (nc == 1 && r8)  // 8 rows at once, each with vd's bits
            for (; j + 8 <= je; j += 8) r8(k, w + size_t(j) * a.w_stride, a.w_stride, at, a.y + t * a.y_stride + j);
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

namespace {
// Runs fn(row_in, row_out) over all rows of x/y, split across the pool.
template <class F>
void for_rows(CRows x, Rows y, ThreadPool& pool, F&& fn) {
  const int64_t nr = x.n1 * x.n2;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, x.ne0));
  auto body = [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i1 = r % x.n1, i2 = r / x.n1;
      fn(x.row(i1, i2), y.row(i1, i2));
    }
  };
  if (nr <= grain) body(0, nr, 0);
  else pool.parallel_for(nr, body, grain);
}
}  // namespace

void rms_norm(CRows x, const float* w, Rows y, float eps, ThreadPool& pool) {
  // ggml's arithmetic (ggml_compute_forward_rms_norm_f32): float squares summed in double, the mean
  // and 1/sqrt in float, then (x * scale) * w.
  const int64_t n = x.ne0;
  for_rows(x, y, pool, [&](const float* xr, float* yr) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / double(n));
    const float r = 1.0f / std::sqrt(mean + eps);
    if (w) for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r * w[i];
    else for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r;
  });
}

void l2_norm(CRows x, Rows y, float eps, ThreadPool& pool) {
  const int64_t n = x.ne0;
  // llama.cpp's build_gdn_l2_norm: rms_norm(x, eps/n) (float squares summed in double, as rms_norm
  // above), then a scale by 1/sqrt(n): y = (x * r) * (1/sqrt(n)), r = 1/sqrt(mean + eps/n).
  const float fn = float(n), eps_n = eps / fn, post = 1.0f / std::sqrt(fn);
  for_rows(x, y, pool, [&](const float* xr, float* yr) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / double(n));
    const float r = 1.0f / std::sqrt(mean + eps_n);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * r * post;
  });
}

void rope(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0 && p.n_rot <= 1024, "rope: n_rot {} vs head_dim {}",
             p.n_rot, x.ne0);
  const int half = p.n_rot / 2;
  // ggml's arithmetic (ggml_rope_cache_init): theta_i = pos * theta_scale^i by repeated float
  // multiplication, theta_scale = powf(base, -2/n_rot), cos/sin in float of freq_scale * theta_i.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  // Pair i is (e[0], e[off]) with e = row + i * step: (i, i + half) when neox, else (2i, 2i + 1).
  const int64_t off = p.neox ? half : 1, step = p.neox ? 1 : 2;
  pool.parallel_for(x.n2, [&](int64_t t0, int64_t t1, int) {
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; ++t) {
      float theta = float(pos[t]);
      for (int i = 0; i < half; ++i) {
        const float th = p.freq_scale * theta;
        cs[i] = std::cos(th);
        sn[i] = std::sin(th);
        theta *= theta_scale;
      }
      for (int64_t h = 0; h < x.n1; ++h) {
        float* r = x.row(h, t);
        for (int i = 0; i < half; ++i) {
          float* e = r + i * step;
          const float x0 = e[0], x1 = e[off];
          // ggml's compiler contracts x0*c - x1*s into fma(x0, c, -(x1*s)).
          e[0] = std::fma(x0, cs[i], -(x1 * sn[i]));
          e[off] = std::fma(x0, sn[i], x1 * cs[i]);
        }
      }
    }
  });
}

void rope_multi(Rows x, const int32_t* pos, const RopeParams& p, ThreadPool& pool) {
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x.ne0 && p.n_rot <= 1024,
             "rope_multi: n_rot {} vs head_dim {}", p.n_rot, x.ne0);
  KILN_CHECK(p.multi != RopeParams::Multi::None, "rope_multi: RopeParams::multi is None");
  const int half = p.n_rot / 2;
  const bool vision = p.multi == RopeParams::Multi::Vision;
  // ggml_mrope_cache_init: one running theta per stream, all multiplied by theta_scale every pair;
  // vision restarts a stream's theta at its section's first pair. With equal positions in every
  // stream (text tokens) the angles are rope()'s bit for bit.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(vision ? half : p.n_rot));
  int stream[512], start[512];
  for (int i = 0; i < half; ++i) {
    int e = 0;
    rope_multi_pair(p, i, stream[i], e);
    start[i] = vision && e == 0;
  }
  pool.parallel_for(x.n2, [&](int64_t t0, int64_t t1, int) {
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; ++t) {
      float th[4];
      for (int s = 0; s < 4; ++s) th[s] = float(pos[s * x.n2 + t]);
      for (int i = 0; i < half; ++i) {
        if (start[i]) th[stream[i]] = float(pos[stream[i] * x.n2 + t]);
        const float a = p.freq_scale * th[stream[i]];
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
        for (float& v : th) v *= theta_scale;
      }
      for (int64_t h = 0; h < x.n1; ++h) {
        float* r = x.row(h, t);
        for (int i = 0; i < half; ++i) {
          const float x0 = r[i], x1 = r[i + half];
          r[i] = std::fma(x0, cs[i], -(x1 * sn[i]));
          r[i + half] = std::fma(x0, sn[i], x1 * cs[i]);
        }
      }
    }
  });
}

void softmax(Rows x, float scale, ThreadPool& pool) {
  const int64_t n = x.ne0;
  for_rows(x, x, pool, [&](const float* xr, float* yr) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, scale * xr[i]);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (yr[i] = std::exp(scale * xr[i] - mx));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
  });
}

void silu(const float* x, float* y, int64_t n) { cpu::table().silu(x, y, n); }
void swiglu(const float* gate, const float* up, float* y, int64_t n) { cpu::table().swiglu(gate, up, y, n); }
void sigmoid_mul(const float* x, const float* g, float* y, int64_t n) { cpu::table().sigmoid_mul(x, g, y, n); }
void sigmoid(const float* x, float* y, int64_t n) { cpu::table().sigmoid(x, y, n); }
void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
  }
}
void gelu_erf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
}

void softplus(const float* x, float* y, int64_t n) {
  // ggml's softplus: logf(1 + expf(x)), x above 20 passed through.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 20.f ? x[i] : std::log(1.0f + std::exp(x[i]));
}
void add(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i]; }
void mul(const float* a, const float* b, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i]; }
void scale(const float* x, float s, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s; }

namespace {
// id[0..k) = the k largest scores, largest first (ties: lower index): k passes of argmax over the
// not-yet-chosen (k is small: 8-10 of 64-512).
void select_topk(const float* score, int64_t n, int k, int32_t* id) {
  for (int i = 0; i < k; ++i) {
    int32_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int j = 0; j < i; ++j) taken |= id[j] == e;
      if (!taken && (best < 0 || score[e] > score[best])) best = int32_t(e);
    }
    id[i] = best;
  }
}
}  // namespace

// One pass per row keeping the k best so far in a heap whose front is the worst of them (most
// entries are rejected by one comparison with it), then the heap sorted best first.
void top_logits(const float* logits, int64_t V, int64_t n, int k, int32_t* ids, float* vals) {
  KILN_CHECK(k >= 1 && k <= V, "top_logits: k {} vs V {}", k, V);
  struct E {
    float v;
    int32_t id;
  };
  // a before b: larger value, NaN last, ties lower id first.
  const auto before = [](const E& a, const E& b) {
    const bool na = a.v != a.v, nb = b.v != b.v;
    if (na || nb) return na == nb ? a.id < b.id : nb;
    return a.v > b.v || (a.v == b.v && a.id < b.id);
  };
  thread_local std::vector<E> heap;
  heap.resize(size_t(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * V;
    for (int i = 0; i < k; ++i) heap[size_t(i)] = {l[i], int32_t(i)};
    std::make_heap(heap.begin(), heap.end(), before);
    for (int64_t e = k; e < V; ++e) {
      const E c{l[e], int32_t(e)};
      if (!before(c, heap.front())) continue;
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), before);
    }
    std::sort_heap(heap.begin(), heap.end(), before);
    for (int i = 0; i < k; ++i) {
      ids[r * k + i] = heap[size_t(i)].id;
      vals[r * k + i] = heap[size_t(i)].v;
    }
  }
}

void topk_route(const float* logits, int64_t n_expert, int64_t n_tok, int k, bool renorm, float w_scale,
                int32_t* ids, float* weights) {
  KILN_CHECK(k >= 1 && k <= n_expert && (n_expert <= 4096 || k == 1), "topk_route: k {} vs n_expert {}", k, n_expert);
  const cpu::Table& T = cpu::table();
  if (n_expert > 4096) {
    // k = 1 over a vocabulary (the MTP drafter's argmax, model/mtp.cpp): the first maximum and its
    // softmax probability (the sum of exp in double), scaled unless renorm (then 1) — not a router.
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* l = logits + t * n_expert;
      const int64_t best = std::max_element(l, l + n_expert) - l;
      double sum = 0;
      for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(double(l[e]) - double(l[best]));
      ids[t] = int32_t(best);
      weights[t] = (renorm ? 1.0f : float(1.0 / sum)) * w_scale;
    }
    return;
  }
  if (T.ggml_softmax_exp) {
    // llama.cpp's build_moe_ffn (softmax gating) in ggml's arithmetic: p = soft_max(logits) (vector
    // exp, sum in double, times float(1/sum)); top k of p by argsort, descending (ties: lower id);
    // w = p of those; renormalised by their sum (in double, rounded to float, clamped below at
    // 2^-14) with a float division; scaled unless the scale is 0 or 1.
    float p[4096];
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* l = logits + t * n_expert;
      float mx = -INFINITY;
      for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
      const float inv = float(1.0 / T.ggml_softmax_exp(l, mx, p, n_expert));
      for (int64_t e = 0; e < n_expert; ++e) p[e] *= inv;
      int32_t* id = ids + t * k;
      float* wt = weights + t * k;
      select_topk(p, n_expert, k, id);
      for (int i = 0; i < k; ++i) wt[i] = p[id[i]];
      if (renorm) {
        double ws = 0;
        for (int i = 0; i < k; ++i) ws += double(wt[i]);
        const float wsum = std::max(float(ws), 6.103515625e-5f);
        for (int i = 0; i < k; ++i) wt[i] = wt[i] / wsum;
      }
      if (w_scale != 0.0f && w_scale != 1.0f)
        for (int i = 0; i < k; ++i) wt[i] *= w_scale;
    }
    return;
  }
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = logits + t * n_expert;
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(l[e] - mx);
    int32_t* id = ids + t * k;
    float* wt = weights + t * k;
    select_topk(l, n_expert, k, id);
    float ksum = 0;
    for (int i = 0; i < k; ++i) {
      wt[i] = std::exp(l[id[i]] - mx) / sum;
      ksum += wt[i];
    }
    for (int i = 0; i < k; ++i) wt[i] = (renorm ? wt[i] / ksum : wt[i]) * w_scale;
  }
}

void hadamard(Rows x, int64_t n, ThreadPool& pool) {
  KILN_CHECK(n > 0 && (n & (n - 1)) == 0 && x.ne0 % n == 0, "hadamard: chunk {} of rows of {}", n, x.ne0);
  const float sc = 1.0f / std::sqrt(float(n));
  pool.parallel_for(x.n_rows(), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = x.row(r % x.n1, r / x.n1);
      for (int64_t c = 0; c < x.ne0; c += n) {
        float* y = row + c;
        for (int64_t i = 0; i < n; ++i) y[i] *= sc;
        for (int64_t len = 1; len < n; len <<= 1)
          for (int64_t i = 0; i < n; i += 2 * len)
            for (int64_t j = i; j < i + len; ++j) {
              const float u = y[j], v = y[j + len];
              y[j] = u + v;
              y[j + len] = u - v;
            }
      }
    }
  });
}

void kv_store(GgmlType type, CRows x, const int32_t* pos, void* dst, size_t pos_stride, size_t head_stride) {
  // Q8_0 rows as ggml's CPU backend writes them (its SIMD quantize_row_q8_0, which rounds differently
  // from the reference quantizer); the other types through the reference conversion, as ggml does.
  const cpu::QuantizeActFn q8 = cpu::table().quantize_act[cpu::type_index(GgmlType::Q8_0)];
  if (type != GgmlType::Q8_0 || !q8 || x.ne0 % 32 != 0) {
    ref::kv_store(type, x, pos, dst, pos_stride, head_stride);
    return;
  }
  for (int64_t t = 0; t < x.n2; ++t)
    for (int64_t h = 0; h < x.n1; ++h)
      q8(x.row(h, t), x.ne0, static_cast<char*>(dst) + size_t(pos[t]) * pos_stride + size_t(h) * head_stride);
}

namespace {
constexpr int kAttnG = 8;     // query heads processed together (share each K/V row conversion)
constexpr int kAttnBk = 64;   // keys per tile of the online softmax
constexpr int kMaxSplitsPerThread = 4;

// Online-softmax state of up to kAttnG heads over a key range.
struct AttnState {
  float m[kAttnG], l[kAttnG];
  alignas(64) float acc[kAttnG][512];
};

// How attend_range forms its sums. Tiled and PerKey are llama.cpp's CPU flash attention
// (ggml_compute_forward_flash_attn_ext) operation for operation, on the AVX-512 tables:
//  - Tiled (F16 or F32 K and V, llama.cpp's path for batches of >= 64 tokens): keys in tiles of 64 at
//    absolute positions; per tile the 64 scores as one FMA chain over d each (F32 q, keys widened),
//    times scale; M' = max(M, tile max), on a new maximum acc and S scaled by exp(M - M');
//    probabilities by ggml's soft_max (its exp, 16-lane sums in double) added to S; acc += p * v as
//    one FMA per key in key order; out = acc * (1/S).
//  - PerKey (quantized K, or K and V of different types; llama.cpp's path for every batch size then):
//    q rounded to the K row's dot type (Q8_0 for Q8_0/Q4_0 keys, F16 for F16 keys), the score by that
//    type's ggml dot, then the online softmax one key at a time (exp by expf, S = S*ms + vs) with the
//    accumulator in F16 when V is F16 (ggml_vec_mad_f16), else in F32 on the dequantized V row.
// llama.cpp switches to other orders for batches of < 64 tokens with F16 K/V (F16 accumulation) and
// for single tokens with >= 512 keys (a thread-count-dependent split); kiln keeps one order for every
// batch, so its results stay batch-invariant, and equal llama.cpp's prefill bit for bit.
//  - Streaming (other hosts, head_dim % 16 != 0): kiln's online softmax in F32 with its own dots.
enum class FaOrder { Streaming, Tiled, PerKey };

FaOrder fa_order(const Table& T, GgmlType kt, GgmlType vt, int64_t D) {
  if (!T.ggml_fa_scores || !T.ggml_softmax_exp || D % 16 != 0) return FaOrder::Streaming;
  const auto is = [](GgmlType t, std::initializer_list<GgmlType> l) { return std::find(l.begin(), l.end(), t) != l.end(); };
  if (kt == vt && is(kt, {GgmlType::F16, GgmlType::F32})) return FaOrder::Tiled;
  if (is(kt, {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) && is(vt, {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}))
    return FaOrder::PerKey;
  return FaOrder::Streaming;
}

const char* kv_row(const KvView& kv, int64_t j, int64_t hk) {
  return static_cast<const char*>(kv.data) + size_t(j) * kv.pos_stride + size_t(hk) * kv.head_stride;
}

void attend_reset(AttnState& st, int ng, int64_t D) {
  for (int g = 0; g < ng; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0;
    std::fill(st.acc[g], st.acc[g] + D, 0.f);
  }
}

void attend_streaming(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                      const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D,
                      float scale, AttnState& st) {
  alignas(64) float kr[512], vr[512];
  float sc[kAttnG][kAttnBk];
  attend_reset(st, ng, D);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kAttnBk) {
    const int nb = int(std::min<int64_t>(kAttnBk, j_end - j0));
    for (int jj = 0; jj < nb; ++jj) {
      kdeq(kv_row(kv_k, j0 + jj, hk), kr, D);
      for (int g = 0; g < ng; ++g) sc[g][jj] = T.dot_f32(q.row(h0 + g, t), kr, D) * scale;
    }
    for (int g = 0; g < ng; ++g) {
      float tm = st.m[g];
      for (int jj = 0; jj < nb; ++jj) tm = std::max(tm, sc[g][jj]);
      const float corr = std::exp(st.m[g] - tm);  // 0 on the first tile (m = -inf)
      if (corr != 1.f) {
        T.scale(st.acc[g], corr, D);
        st.l[g] *= corr;
      }
      st.m[g] = tm;
      for (int jj = 0; jj < nb; ++jj) {
        sc[g][jj] = std::exp(sc[g][jj] - tm);
        st.l[g] += sc[g][jj];
      }
    }
    for (int jj = 0; jj < nb; ++jj) {
      vdeq(kv_row(kv_v, j0 + jj, hk), vr, D);
      for (int g = 0; g < ng; ++g) T.axpy(sc[g][jj], vr, st.acc[g], D);
    }
  }
}

static_assert(kAttnBk == 64, "the tiled order is ggml's 64-key tile");
void attend_tiled(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                  const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D, float scale,
                  AttnState& st) {
  alignas(64) float kt[512 * kAttnBk];  // [D][64]: the key tile, transposed
  alignas(64) float kr[512], vr[512];
  alignas(64) float p[kAttnG][kAttnBk];
  attend_reset(st, ng, D);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kAttnBk) {
    const int nb = int(std::min<int64_t>(kAttnBk, j_end - j0));
    for (int jj = 0; jj < nb; ++jj) {
      kdeq(kv_row(kv_k, j0 + jj, hk), kr, D);
      for (int64_t d = 0; d < D; ++d) kt[d * kAttnBk + jj] = kr[d];
    }
    for (int g = 0; g < ng; ++g) {
      alignas(64) float sc[kAttnBk];
      T.ggml_fa_scores(q.row(h0 + g, t), kt, D, sc);
      float tmax = -INFINITY;
      for (int jj = 0; jj < kAttnBk; ++jj) {
        sc[jj] = jj < nb ? sc[jj] * scale : -INFINITY;  // keys past the query: masked, probability 0
        tmax = std::max(tmax, sc[jj]);
      }
      const float mnew = std::fmax(st.m[g], tmax);
      if (mnew > st.m[g]) {
        const float ms = std::exp(st.m[g] - mnew);
        T.scale(st.acc[g], ms, D);
        st.l[g] *= ms;
      }
      st.m[g] = mnew;
      st.l[g] = float(double(st.l[g]) + T.ggml_softmax_exp(sc, mnew, p[g], kAttnBk));
    }
    for (int jj = 0; jj < nb; ++jj) {
      vdeq(kv_row(kv_v, j0 + jj, hk), vr, D);
      for (int g = 0; g < ng; ++g) T.axpy(p[g][jj], vr, st.acc[g], D);
    }
  }
}

void attend_per_key(const Table& T, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin, int64_t j_end,
                    const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn vdeq, int64_t D, float scale, AttnState& st) {
  constexpr int kQBytes = 512 * 2;  // q of up to 512 elements as F16 (1024 bytes) or Q8_0 (544)
  alignas(64) uint8_t qk[kAttnG][kQBytes];  // q in the key row's dot type
  alignas(64) uint16_t acc16[kAttnG][512];  // F16 accumulators (F16 V)
  alignas(64) float vr[512];
  const bool k_f16 = kv_k.type == GgmlType::F16, v_f16 = kv_v.type == GgmlType::F16;
  // ggml_vec_dot's order (llama.cpp never repacks the cache): for Q4_0 on AVX-512 that is the
  // rows_not8 entry, vec_dot_q8 being the repacked weights' order there.
  const int ki = cpu::type_index(kv_k.type);
  const cpu::VecDotQ8Fn kdot = k_f16 ? nullptr : T.vec_dot_q8_rows_not8[ki] ? T.vec_dot_q8_rows_not8[ki] : T.vec_dot_q8[ki];
  KILN_CHECK(k_f16 || (kdot && T.quantize_act[cpu::type_index(GgmlType::Q8_0)]), "attention: no dot for K type");
  attend_reset(st, ng, D);
  for (int g = 0; g < ng; ++g) {
    const float* qr = q.row(h0 + g, t);
    if (k_f16) {
      auto* qh = reinterpret_cast<uint16_t*>(qk[g]);
      for (int64_t i = 0; i < D; ++i) qh[i] = f32_to_fp16(qr[i]);
    } else {
      T.quantize_act[cpu::type_index(GgmlType::Q8_0)](qr, D, qk[g]);
    }
    if (v_f16) std::fill(acc16[g], acc16[g] + D, uint16_t(0));
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const char* krow = kv_row(kv_k, j, hk);
    const char* vrow = kv_row(kv_v, j, hk);
    if (!v_f16) vdeq(vrow, vr, D);
    for (int g = 0; g < ng; ++g) {
      float s;
      if (k_f16)
        s = T.ggml_dot_f16(reinterpret_cast<const uint16_t*>(krow), reinterpret_cast<const uint16_t*>(qk[g]), D, false);
      else
        kdot(D, krow, qk[g], 0, 1, &s);
      s *= scale;
      float ms = 1.f, vs = 1.f;
      if (s > st.m[g]) {
        ms = std::exp(st.m[g] - s);
        st.m[g] = s;
        if (v_f16) T.scale_f16(acc16[g], ms, D);
        else T.scale(st.acc[g], ms, D);
      } else {
        vs = std::exp(s - st.m[g]);
      }
      if (v_f16) T.mad_f16(acc16[g], reinterpret_cast<const uint16_t*>(vrow), vs, D);
      else T.axpy(vs, vr, st.acc[g], D);
      st.l[g] = std::fma(st.l[g], ms, vs);
    }
  }
  if (v_f16)
    for (int g = 0; g < ng; ++g)
      for (int64_t i = 0; i < D; ++i) st.acc[g][i] = fp16_to_f32(acc16[g][i]);
}

// Attends heads h0..h0+ng-1 (kv-head hk) of token t over keys [j_begin, j_end) into st.
void attend_range(const Table& T, FaOrder order, CRows q, int64_t t, int64_t h0, int ng, int64_t hk, int64_t j_begin,
                  int64_t j_end, const KvView& kv_k, const KvView& kv_v, cpu::ToF32Fn kdeq, cpu::ToF32Fn vdeq, int64_t D,
                  float scale, AttnState& st) {
  switch (order) {
    case FaOrder::Tiled: return attend_tiled(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, kdeq, vdeq, D, scale, st);
    case FaOrder::PerKey: return attend_per_key(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, vdeq, D, scale, st);
    case FaOrder::Streaming:
      return attend_streaming(T, q, t, h0, ng, hk, j_begin, j_end, kv_k, kv_v, kdeq, vdeq, D, scale, st);
  }
}

// Keys are reduced in fixed chunks of kAttnChunk absolute positions ([0, 256), [256, 512), ...):
// each chunk's online-softmax state starts fresh, and the chunk states of a query are folded in
// chunk order by fold_state(). A query's result therefore depends only on its own position and the
// cache, never on the other queries, the thread count or whether the chunks ran on one thread
// (prefill) or were spread across threads (decode).
constexpr int64_t kAttnChunk = 256;
static_assert(kAttnChunk % kAttnBk == 0);

// run = run (+) part for heads 0..ng-1 (run empty: a copy).
void fold_state(const Table& T, AttnState& run, const AttnState& part, int ng, int64_t D, bool first) {
  for (int g = 0; g < ng; ++g) {
    if (first) {
      run.m[g] = part.m[g];
      run.l[g] = part.l[g];
      std::copy(part.acc[g], part.acc[g] + D, run.acc[g]);
      continue;
    }
    const float M = std::max(run.m[g], part.m[g]);
    const float fr = std::exp(run.m[g] - M), fp = std::exp(part.m[g] - M);
    T.scale(run.acc[g], fr, D);
    T.axpy(fp, part.acc[g], run.acc[g], D);
    run.l[g] = run.l[g] * fr + part.l[g] * fp;
    run.m[g] = M;
  }
}
}  // namespace

bool attention_ggml_supported(GgmlType k, GgmlType v, int64_t head_dim) {
  return k == GgmlType::F16 && v == GgmlType::F16 && head_dim % 16 == 0 && cpu::table().ggml_kqv != nullptr;
}

namespace {
// llama.cpp's attention without flash attention, per (token, q-head): kq = K . f16(q) (ggml_mul_mat),
// soft_max_ext(kq * scale) with ggml's exp, kqv = V^T . f16(probabilities). Positions past pos[t]
// are masked in ggml (probability exactly 0) and skipped here; the lanes and chains of the sums
// follow the absolute position, so the result is ggml's bit for bit.
void attention_ggml(CRows q, const int32_t* pos, const KvView& kv_k, const KvView& kv_v, const AttnParams& p, Rows out,
                    ThreadPool& pool) {
  const Table& T = cpu::table();
  const int64_t D = p.head_dim, group = p.n_head / p.n_head_kv;
  const bool tiny = p.order == AttnOrder::GgmlTiny;
  pool.parallel_for(q.n2 * p.n_head, [&](int64_t i0, int64_t i1, int) {
    // Per-thread scratch, grown once to the longest context seen (not per call).
    thread_local std::vector<float> sc, ex, acc;
    thread_local std::vector<uint16_t> qh;
    if (int64_t(acc.size()) < 64 * D) acc.resize(size_t(64 * D));  // kqv: 4 chains x 16 lanes x D
    qh.resize(size_t(D));
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t t = it / p.n_head, h = it % p.n_head, hk = h / group;
      const int64_t n = int64_t(pos[t]) + 1, n16 = (n + 15) / 16 * 16;
      if (int64_t(sc.size()) < n16) { sc.resize(size_t(n16)); ex.resize(size_t(n16)); }
      const float* qr = q.row(h, t);
      for (int64_t i = 0; i < D; ++i) qh[size_t(i)] = f32_to_fp16(qr[i]);
      const auto* kb = static_cast<const uint8_t*>(kv_k.data) + size_t(hk) * kv_k.head_stride;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const auto* kj = reinterpret_cast<const uint16_t*>(kb + size_t(j) * kv_k.pos_stride);
        sc[size_t(j)] = T.ggml_dot_f16(kj, qh.data(), D, tiny) * p.scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      for (int64_t j = n; j < n16; ++j) sc[size_t(j)] = -INFINITY;
      const double sum = T.ggml_softmax_exp(sc.data(), mx, ex.data(), n16);
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) ex[size_t(j)] = fp16_to_f32(f32_to_fp16(ex[size_t(j)] * inv));
      T.ggml_kqv(static_cast<const uint8_t*>(kv_v.data) + size_t(hk) * kv_v.head_stride, kv_v.pos_stride, ex.data(), n,
                 D, tiny, acc.data(), out.row(h, t));
    }
  });
}
}  // namespace

size_t attention_workspace(const AttnParams& p, int n_threads) {
  return size_t(kMaxSplitsPerThread) * size_t(std::max(1, n_threads)) * align64(sizeof(AttnState));
}

void attention(CRows q, const int32_t* pos, const KvView& kv_k, const KvView& kv_v, const AttnParams& p, Rows out, void* ws,
               ThreadPool& pool) {
  const int64_t D = p.head_dim;
  KILN_CHECK(D > 0 && D <= 512 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "attention: head_dim {} heads {}/{}",
             D, p.n_head, p.n_head_kv);
  int64_t max_n = 0;  // keys seen by the query that sees the most
  for (int64_t t = 0; t < q.n2; ++t) {
    KILN_CHECK(pos[t] >= 0 && pos[t] < kv_k.n_kv && pos[t] < kv_v.n_kv, "attention: pos {} outside cache of {}", pos[t],
               kv_k.n_kv);
    max_n = std::max<int64_t>(max_n, int64_t(pos[t]) + 1);
  }
  if (p.order != AttnOrder::Flash && attention_ggml_supported(kv_k.type, kv_v.type, D)) {
    attention_ggml(q, pos, kv_k, kv_v, p, out, pool);
    return;
  }
  const Table& T = cpu::table();
  const cpu::ToF32Fn kdeq = T.to_f32[cpu::type_index(kv_k.type)], vdeq = T.to_f32[cpu::type_index(kv_v.type)];
  KILN_CHECK(kdeq && vdeq, "attention: unsupported cache types");
  const FaOrder order = fa_order(T, kv_k.type, kv_v.type, D);
  const int64_t group = p.n_head / p.n_head_kv;
  const int64_t n_gchunks = (group + kAttnG - 1) / kAttnG;
  const int64_t n_items = q.n2 * p.n_head_kv * n_gchunks;
  auto item_geom = [&](int64_t it, int64_t& t, int64_t& hk, int64_t& h0, int& ng) {
    const int64_t gc = it % n_gchunks;
    hk = (it / n_gchunks) % p.n_head_kv;
    t = it / (n_gchunks * p.n_head_kv);
    h0 = hk * group + gc * kAttnG;
    ng = int(std::min<int64_t>(kAttnG, hk * group + group - h0));
  };
  auto chunk_range = [&](int64_t n, int64_t c, int64_t& jb, int64_t& je) {
    jb = c * kAttnChunk;
    je = std::min(n, jb + kAttnChunk);
  };
  auto write_out = [&](const AttnState& st, int64_t t, int64_t h0, int ng) {
    for (int g = 0; g < ng; ++g) {
      float* o = out.row(h0 + g, t);
      const float inv = 1.0f / st.l[g];
      for (int64_t i = 0; i < D; ++i) o[i] = st.acc[g][i] * inv;
    }
  };
  // Spread the chunks of an item across threads when the items alone cannot keep them busy
  // (decode). The result is the same either way; this is only a scheduling choice.
  const int64_t max_chunks = (max_n + kAttnChunk - 1) / kAttnChunk;
  const int64_t n_slots = ws ? int64_t(kMaxSplitsPerThread) * pool.size() : 0;
  const bool spread = ws && pool.size() > 1 && n_items < pool.size() && max_chunks >= 2 && n_slots >= 2 * n_items;
  if (!spread) {
    pool.parallel_for(n_items, [&](int64_t i0, int64_t i1, int) {
      AttnState run, part;
      for (int64_t it = i0; it < i1; ++it) {
        int64_t t, hk, h0;
        int ng;
        item_geom(it, t, hk, h0, ng);
        const int64_t n = int64_t(pos[t]) + 1;
        for (int64_t c = 0; c * kAttnChunk < n; ++c) {
          int64_t jb, je;
          chunk_range(n, c, jb, je);
          attend_range(T, order, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, c == 0 ? run : part);
          if (c > 0) fold_state(T, run, part, ng, D, false);
        }
        write_out(run, t, h0, ng);
      }
    });
    return;
  }
  // Workspace: one running state per item, then waves of W chunks per item computed in parallel
  // and folded in chunk order.
  auto* base = static_cast<uint8_t*>(ws);
  const size_t sb = align64(sizeof(AttnState));
  auto slot = [&](int64_t i) { return reinterpret_cast<AttnState*>(base + size_t(i) * sb); };
  const int64_t W = (n_slots - n_items) / n_items;
  for (int64_t c0 = 0; c0 < max_chunks; c0 += W) {
    pool.parallel_for(n_items * W, [&](int64_t u0, int64_t u1, int) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t it = u / W, c = c0 + u % W;
        int64_t t, hk, h0;
        int ng;
        item_geom(it, t, hk, h0, ng);
        const int64_t n = int64_t(pos[t]) + 1;
        if (c * kAttnChunk >= n) continue;
        int64_t jb, je;
        chunk_range(n, c, jb, je);
        attend_range(T, order, q, t, h0, ng, hk, jb, je, kv_k, kv_v, kdeq, vdeq, D, p.scale, *slot(n_items + u));
      }
    }, 1);
    for (int64_t it = 0; it < n_items; ++it) {
      int64_t t, hk, h0;
      int ng;
      item_geom(it, t, hk, h0, ng);
      const int64_t n = int64_t(pos[t]) + 1;
      for (int64_t c = c0; c < c0 + W && c * kAttnChunk < n; ++c)
        fold_state(T, *slot(it), *slot(n_items + it * W + (c - c0)), ng, D, c == 0);
    }
  }
  for (int64_t it = 0; it < n_items; ++it) {
    int64_t t, hk, h0;
    int ng;
    item_geom(it, t, hk, h0, ng);
    write_out(*slot(it), t, h0, ng);
  }
}

void conv1d_silu(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t C, int64_t n_t, int d_conv, ThreadPool& pool) {
  KILN_CHECK(d_conv >= 1 && d_conv <= 8, "conv1d_silu: d_conv {} not in 1..8", d_conv);
  constexpr int kCB = 16;  // channels per inner block (one cache line of x per token)
  const int K = d_conv;
  const Table& T = cpu::table();
  const auto taps16 = T.ggml_conv_taps16;  // AVX-512: ggml's ssm_conv (an fma per tap from 0)
  pool.parallel_for((C + kCB - 1) / kCB, [&](int64_t b0, int64_t b1, int) {
    alignas(64) float win[8][kCB] = {}, wt[8][kCB] = {}, acc[kCB];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kCB;
      const int nc = int(std::min<int64_t>(kCB, C - c0));
      for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < K; ++j) wt[j][c] = w[(c0 + c) * K + j];
        for (int j = 0; j < K - 1; ++j) win[j][c] = state[(c0 + c) * (K - 1) + j];
      }
      for (int64_t t = 0; t < n_t; ++t) {
        const float* xt = x + t * x_stride + c0;
        float* yt = y + t * y_stride + c0;
        for (int c = 0; c < nc; ++c) win[K - 1][c] = xt[c];  // read before the (possibly aliased) write below
        if (taps16) {
          taps16(&win[0][0], &wt[0][0], K, acc);
          std::memcpy(yt, acc, size_t(nc) * sizeof(float));
        } else {
          for (int c = 0; c < nc; ++c) {
            float s = 0;
            for (int j = 0; j < K; ++j) s += wt[j][c] * win[j][c];
            yt[c] = s;
          }
        }
        for (int j = 0; j < K - 1; ++j)
          for (int c = 0; c < nc; ++c) win[j][c] = win[j + 1][c];
        T.silu(yt, yt, nc);
      }
      for (int c = 0; c < nc; ++c)
        for (int j = 0; j < K - 1; ++j) state[(c0 + c) * (K - 1) + j] = win[j][c];
    }
  });
}

void gated_delta_rule(const DeltaArgs& a, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  const Table& T = cpu::table();
  const int64_t S = a.S;
  const float qscale = 1.0f / std::sqrt(float(S));
  // ggml's gated_delta_net: its rows are independent, so scale / dot / fma-update / dot per row is
  // its all-rows-per-phase order; the dots in ggml_vec_dot_f32's order where the table has it.
  const int si = S == 64 ? 0 : S == 128 ? 1 : S == 256 ? 2 : -1;
  if (const cpu::DeltaRowsFn rows = si >= 0 && T.ggml_delta_rows[si] && T.ggml_dot_f32 ? T.ggml_delta_rows[si] : nullptr) {
    // Fused (AVX-512): the same per-row steps with each row in registers across a block of tokens.
    // Rows are independent, so work items are (head, 32 rows), dynamically scheduled: the bits do
    // not depend on the split.
    constexpr int64_t kRowsPerItem = 32, kTokBlock = 64;
    const int64_t rpi = std::min<int64_t>(kRowsPerItem, S);
    // A range may span heads (KILN_DYNAMIC_ROWS=0 makes the schedule static): one head at a time.
    auto head_rows = [&](int64_t h, int64_t j0, int64_t j1) {
      const int64_t hk = h % a.Hk;
      alignas(64) float decay[kTokBlock], beta[kTokBlock];
      for (int64_t t0 = 0; t0 < a.n_t; t0 += kTokBlock) {
        const int64_t L = std::min(kTokBlock, a.n_t - t0);
        for (int64_t t = 0; t < L; ++t) {
          decay[t] = std::exp(a.g[(t0 + t) * a.Hv + h]);
          beta[t] = a.beta[(t0 + t) * a.Hv + h];
        }
        cpu::DeltaRowsArgs ra;
        ra.st = a.state + h * S * S;
        ra.S = S;
        ra.j0 = j0;
        ra.j1 = j1;
        ra.n_t = L;
        ra.q = a.q + t0 * a.qk_stride + hk * S;
        ra.k = a.k + t0 * a.qk_stride + hk * S;
        ra.qk_stride = a.qk_stride;
        ra.v = a.v + t0 * a.v_stride + h * S;
        ra.v_stride = a.v_stride;
        ra.decay = decay;
        ra.beta = beta;
        ra.out = a.out + t0 * a.out_stride + h * S;
        ra.out_stride = a.out_stride;
        ra.qscale = qscale;
        rows(ra);
      }
    };
    pool.parallel_for_dynamic(a.Hv * S, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1;) {
        const int64_t h = i / S, e = std::min(i1, (h + 1) * S);
        head_rows(h, i - h * S, e - h * S);
        i = e;
      }
    }, rpi, rpi);
    return;
  }
  auto dot = [&T](const float* x, const float* y, int64_t n) {
    return T.ggml_dot_f32 ? T.ggml_dot_f32(x, y, n) : T.dot_f32(x, y, n);
  };
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t = 0; t < a.n_t; ++t) {
        const float* q = a.q + t * a.qk_stride + hk * S;
        const float* k = a.k + t * a.qk_stride + hk * S;
        const float* v = a.v + t * a.v_stride + h * S;
        float* o = a.out + t * a.out_stride + h * S;
        const float decay = std::exp(a.g[t * a.Hv + h]), beta = a.beta[t * a.Hv + h];
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;  // row j = column j of M: M[i][j] for all i
          T.scale(row, decay, S);
          const float dj = (v[j] - dot(row, k, S)) * beta;
          T.axpy(dj, k, row, S);
          o[j] = dot(row, q, S) * qscale;
        }
      }
    }
  });
}

namespace {
// Per-thread scratch of the chunked form: KS QS Dl [C, S], KK QK [C, C], G cf [C] floats.
size_t delta_chunk_bytes(int64_t S, int64_t C) { return align64(size_t(3 * C * S + 2 * C * C + 2 * C) * 4); }
}  // namespace

size_t gated_delta_chunked_workspace(int64_t S, int chunk, int n_threads) {
  return size_t(n_threads) * delta_chunk_bytes(S, chunk);
}

// Chunked form. Within a chunk of L tokens with cumulative log-decay G_t (inclusive) and start
// state M0, the deltas solve a unit lower-triangular system and the outputs / final state follow:
//   d_t = beta_t (v_t - e^{G_t} M0^T k_t - sum_{s<t} e^{G_t-G_s} (k_t.k_s) d_s)
//   o_t = (e^{G_t} M0^T q_t + sum_{s<=t} e^{G_t-G_s} (q_t.k_s) d_s) / sqrt(S)
//   M_L = e^{G_L} M0 + sum_s e^{G_L-G_s} k_s d_s^T
void gated_delta_rule_chunked(const DeltaArgs& a, int chunk, void* ws, ThreadPool& pool) {
  KILN_CHECK(a.Hk > 0 && a.Hv % a.Hk == 0, "gated_delta_rule_chunked: Hv {} not a multiple of Hk {}", a.Hv, a.Hk);
  KILN_CHECK(chunk >= 1 && ws != nullptr, "gated_delta_rule_chunked: chunk {} / workspace", chunk);
  const Table& T = cpu::table();
  const int64_t S = a.S, C = chunk;
  const float qscale = 1.0f / std::sqrt(float(S));
  const size_t per = delta_chunk_bytes(S, C);
  pool.parallel_for(a.Hv, [&](int64_t h0, int64_t h1, int tid) {
    float* base = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + size_t(tid) * per);
    float* KS = base;          // [S, C]: row t = M0^T k_t
    float* QS = KS + C * S;    // [S, C]: row t = M0^T q_t
    float* Dl = QS + C * S;    // [S, C]: row t = d_t
    float* KK = Dl + C * S;    // [C, C]: KK[t*C + s] = k_t.k_s
    float* QK = KK + C * C;    // [C, C]
    float* G = QK + C * C;     // [C]
    float* cf = G + C;         // [C]
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hk = h % a.Hk;
      float* st = a.state + h * S * S;
      for (int64_t t0 = 0; t0 < a.n_t; t0 += C) {
        const int64_t L = std::min<int64_t>(C, a.n_t - t0);
        auto qv = [&](int64_t t) { return a.q + (t0 + t) * a.qk_stride + hk * S; };
        auto kv = [&](int64_t t) { return a.k + (t0 + t) * a.qk_stride + hk * S; };
        float gs = 0;
        for (int64_t t = 0; t < L; ++t) G[t] = (gs += a.g[(t0 + t) * a.Hv + h]);
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < S; ++j) {
            KS[t * S + j] = T.dot_f32(st + j * S, kv(t), S);
            QS[t * S + j] = T.dot_f32(st + j * S, qv(t), S);
          }
        for (int64_t t = 0; t < L; ++t)
          for (int64_t s = 0; s <= t; ++s) {
            KK[t * C + s] = T.dot_f32(kv(t), kv(s), S);
            QK[t * C + s] = T.dot_f32(qv(t), kv(s), S);
          }
        for (int64_t t = 0; t < L; ++t) {
          const float beta = a.beta[(t0 + t) * a.Hv + h], eg = std::exp(G[t]);
          const float* v = a.v + (t0 + t) * a.v_stride + h * S;
          float* d = Dl + t * S;
          for (int64_t j = 0; j < S; ++j) d[j] = v[j] - eg * KS[t * S + j];
          for (int64_t s = 0; s < t; ++s) T.axpy(-std::exp(G[t] - G[s]) * KK[t * C + s], Dl + s * S, d, S);
          T.scale(d, beta, S);
          float* o = a.out + (t0 + t) * a.out_stride + h * S;
          for (int64_t j = 0; j < S; ++j) o[j] = eg * QS[t * S + j];
          for (int64_t s = 0; s <= t; ++s) T.axpy(std::exp(G[t] - G[s]) * QK[t * C + s], Dl + s * S, o, S);
          T.scale(o, qscale, S);
        }
        const float eL = std::exp(G[L - 1]);
        for (int64_t s = 0; s < L; ++s) cf[s] = std::exp(G[L - 1] - G[s]);
        for (int64_t j = 0; j < S; ++j) {
          float* row = st + j * S;
          T.scale(row, eL, S);
          for (int64_t s = 0; s < L; ++s) T.axpy(cf[s] * Dl[s * S + j], kv(s), row, S);
        }
      }
    }
  });
}

}  // namespace kiln::kernels
