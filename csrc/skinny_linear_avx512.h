// skinny_linear's tiles for AVX-512 (32 zmm registers, 16-float vectors): the path tuned and
// measured on the AVX-512 dev box (bench/results/linear_cpu.json). Included by skinny_linear.cpp
// only when __AVX512F__ is defined; the code is as it was before the AVX2 path was added.
#pragma once

#include <cstdint>
#include <cstring>

#include "skinny_linear_args.h"
#include "vec_math.h"
#include "vec_shuffle.h"

namespace specdec {
namespace linear {
namespace {

constexpr const char* kTilesIsa = "avx512";

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));

// Rows of x per tile. More rows go in balanced chunks (8 = 4 + 4, 16 = 6 + 5 + 5): a tile of
// 7 or 8 rows leaves room for only 2 weight rows (measured: M = 8 1.1-1.7x slower than F.linear,
// M = 6 0.6-1.0x).
constexpr int kMaxMB = 6;
// A broadcast (v16f{} + s cost a scalar add before each broadcast, seen in objdump of tile_cols;
// the bits are the same: an accumulator that starts at +0 never becomes -0, so the sign of a
// zero product cannot show). As splat8 in the AVX2 tiles.
SPECDEC_INLINE v16f splat16(float s) { return v16f{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

// Sum of the 16 lanes as a tree (halves, quarters, ...): 4 dependent adds, fixed order.
SPECDEC_INLINE float hsum16(v16f v) {
  v8f lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  const v8f s8 = lo + hi;
  v4f a, b;
  std::memcpy(&a, &s8, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&s8) + sizeof a, sizeof b);
  const v4f s4 = a + b;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The sums of four accumulators as lanes 0, 4, 8, 12: one shuffle-and-add tree serves all four
// (hsum16 per accumulator made the lane reduction ~1/3 of a K = 256 tile at M = 5, measured).
// Each sum is added in the same order as hsum16 does (lane i + lane i+8, then +4, +2, +1).
SPECDEC_INLINE v16f reduce4(v16f a, v16f b, v16f c, v16f d) {
  const v16f ab = SPECDEC_SHUFFLE(v16i, a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  SPECDEC_SHUFFLE(v16i, a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const v16f cd = SPECDEC_SHUFFLE(v16i, c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  SPECDEC_SHUFFLE(v16i, c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // lanes: a0..a7 | b0..b7 (ab), c | d (cd) -> a0..a3 | b0..b3 | c0..c3 | d0..d3
  const v16f q = SPECDEC_SHUFFLE(v16i, ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                 SPECDEC_SHUFFLE(v16i, ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const v16f p = q + SPECDEC_SHUFFLE(v16i, q, q, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  return p + SPECDEC_SHUFFLE(v16i, p, p, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
}

// Weight rows (or 16-column vectors) per tile for MB rows of x: MB*NB accumulators + NB weight
// vectors + 1 x vector fit the 32 vector registers of AVX-512 (no spills), and NB divides the
// 64-column blocks (a remainder tile of 1 row is load-bound: measured 8% on the lm_head).
constexpr int tile_width(int mb) { return mb <= 2 ? 8 : 4; }

// Software prefetch of the weight tile this many tiles ahead (one line per row per k step).
// With weights streamed from DRAM (the demo target's 15 MB did not stay in the shared L3:
// ~10 GB/s), memory and compute did not overlap without it: lm_head 256 -> 4096 from cold
// memory, M=5 630 us vs M=1 407 us; with 6 tiles ahead 550 vs 471 us (bench_linear.py --cold,
// noisy box). No change with hot caches.
constexpr int kPrefetchTiles = 6;

// "rows" layout, MB rows of x (from m0) times NB weight rows (from n0).
template <int MB, int NB>
void tile_rows(const Args& a, int64_t m0, int64_t n0) {
  v16f acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = v16f{};
  const float* x = a.x + m0 * a.ldx;
  const float* w = a.w + n0 * a.ldw;
  const int64_t K = a.K, k16 = K - K % 16;
  for (int64_t k = 0; k < k16; k += 16) {
    v16f wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = load_vec<v16f>(w + j * a.ldw + k);
    for (int j = 0; j < NB; ++j) __builtin_prefetch(w + (kPrefetchTiles * NB + j) * a.ldw + k);
    for (int m = 0; m < MB; ++m) {
      const v16f xv = load_vec<v16f>(x + m * a.ldx + k);
      for (int j = 0; j < NB; ++j) acc[m][j] += xv * wv[j];
    }
  }
  // Epilogue: with K = 128 it cost as much as the k loop when done one output at a time
  // (measured: M = 5 2x slower than the cols layout); four outputs of a row go together.
  for (int m = 0; m < MB; ++m) {
    const float* xm = x + m * a.ldx;
    float* ym = a.y + (m0 + m) * a.N + n0;
    if constexpr (NB % 4 == 0) {
      for (int j = 0; j < NB; j += 4) {
        const v16f r = reduce4(acc[m][j], acc[m][j + 1], acc[m][j + 2], acc[m][j + 3]);
        v4f s = low_part<v4f>(SPECDEC_SHUFFLE(v16i, r, r, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12));
        for (int64_t k = k16; k < K; ++k) {
          for (int i = 0; i < 4; ++i) s[i] += xm[k] * w[(j + i) * a.ldw + k];
        }
        if (a.bias) s += load_vec<v4f>(a.bias + n0 + j);
        if (a.residual) s = load_vec<v4f>(a.residual + (m0 + m) * a.ldr + n0 + j) + s;
        store_vec(ym + j, s);
      }
    } else {
      for (int j = 0; j < NB; ++j) {
        float s = hsum16(acc[m][j]);
        for (int64_t k = k16; k < K; ++k) s += xm[k] * w[j * a.ldw + k];
        ym[j] = finish(a, m0 + m, n0 + j, s);
      }
    }
  }
}

// "cols" layout, MB rows of x (from m0) times NV 16-column vectors (from column n0).
template <int MB, int NV>
void tile_cols(const Args& a, int64_t m0, int64_t n0) {
  v16f acc[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = v16f{};
  const float* x = a.x + m0 * a.ldx;
  for (int64_t k = 0; k < a.K; ++k) {
    const float* wk = a.w + k * a.ldw + n0;
    v16f wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = load_vec<v16f>(wk + 16 * j);
    for (int m = 0; m < MB; ++m) {
      const v16f xb = splat16(x[m * a.ldx + k]);
      for (int j = 0; j < NV; ++j) acc[m][j] += xb * wv[j];
    }
  }
  for (int m = 0; m < MB; ++m) {
    float* y = a.y + (m0 + m) * a.N + n0;
    for (int j = 0; j < NV; ++j) {
      v16f out = acc[m][j];
      if (a.bias) out += load_vec<v16f>(a.bias + n0 + 16 * j);
      if (a.residual) out = load_vec<v16f>(a.residual + (m0 + m) * a.ldr + n0 + 16 * j) + out;
      store_vec(y + 16 * j, out);
    }
  }
}

// Output columns [n0, n1) for x rows [m0, m0 + MB), weight rows layout.
template <int MB>
void block_rows(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int NB = tile_width(MB);
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) tile_rows<MB, NB>(a, m0, n);
  for (; n < n1; ++n) tile_rows<MB, 1>(a, m0, n);
}

// Output columns [n0, n1) (n0 a multiple of 16) for x rows [m0, m0 + MB), columns layout.
template <int MB>
void block_cols(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int NV = tile_width(MB);
  int64_t n = n0;
  for (; n + 16 * NV <= n1; n += 16 * NV) tile_cols<MB, NV>(a, m0, n);
  for (; n + 16 <= n1; n += 16) tile_cols<MB, 1>(a, m0, n);
  if (n < n1) cols_scalar(a, m0, MB, n, n1);
}

}  // namespace
}  // namespace linear
}  // namespace specdec
