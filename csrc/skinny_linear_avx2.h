// skinny_linear's tiles for AVX2/FMA machines (16 ymm registers, 8-float vectors), and the
// portable path wherever AVX-512 is absent (GCC lowers the 8-float vectors to what the machine
// has: correct everywhere, tuned for AVX2 only). Included by skinny_linear.cpp.
//
// Why not the AVX-512 tiles compiled for AVX2: their 16-float vectors become pairs of ymm and
// their tiles (up to 24 accumulators + 4 weight vectors, sized for 32 zmm) spill to the stack on
// every k step. Measured on an AMD EPYC (Zen 4, AVX-512 hidden by the VM), 1 thread: 2.5-19x
// the time of F.linear (bench/results/linear_cpu_avx2.json, "before").
//
// Same summation order as the AVX-512 tiles, so both paths give the same bits:
//  - "rows": each output keeps a 16-lane accumulator (here two 8-float halves, lo = lanes 0-7,
//    hi = lanes 8-15) over k steps of 16, reduced as hsum16 does (lo + hi, then halves, then
//    (l0 + l2) + (l1 + l3)), then the K % 16 tail in k order, then bias, then residual.
//  - "cols": each output column is a sequential sum over k (any vector width gives the same).
#pragma once

#include <cstdint>
#include <cstring>

#include "skinny_linear_args.h"
#include "vec_math.h"
#include "vec_shuffle.h"

namespace specdec {
namespace linear {
namespace {

constexpr const char* kTilesIsa =
#if defined(__AVX2__) && defined(__FMA__)
    "avx2";
#else
    "generic";
#endif

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v8i __attribute__((vector_size(32)));

// Rows of x per tile (more rows go in balanced chunks, see run_columns): the tiles below keep
// 6 rows without spills, and a 7th row would cost a weight vector per tile.
constexpr int kMaxMB = 6;

// A broadcast (v8f{} + s costs an add before each broadcast; the bits are the same: an
// accumulator that starts at +0 never becomes -0, so the sign of a zero product cannot show).
SPECDEC_INLINE v8f splat8(float s) { return v8f{s, s, s, s, s, s, s, s}; }

// Keeps a loaded vector in a register: without it GCC re-reads x and the weights from memory for
// every product (vmulps with a memory operand: 2 loads per multiply-add, load-bound).
#if defined(__AVX__)
#define SPECDEC_IN_REGISTER(v) asm("" : "+x"(v))
#else
#define SPECDEC_IN_REGISTER(v) (void)0
#endif

// The 16-lane sum of one accumulator given as s = lo + hi (lane i + lane i+8): halves, then
// (l0 + l2) + (l1 + l3), the order of the AVX-512 path's hsum16.
SPECDEC_INLINE float hsum8(v8f s) {
  const v4f a = low_part<v4f>(s), b = low_part<v4f>(SPECDEC_SHUFFLE(v8i, s, s, 4, 5, 6, 7, 0, 1, 2, 3));
  const v4f s4 = a + b;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// hsum8 of four accumulators at once, as lanes 0..3 (one shuffle-and-add tree; each sum added in
// hsum8's order).
SPECDEC_INLINE v4f reduce4(v8f a, v8f b, v8f c, v8f d) {
  // [a0+a4, a1+a5, a2+a6, a3+a7, b0+b4, ...], likewise c | d
  const v8f ab = SPECDEC_SHUFFLE(v8i, a, b, 0, 1, 2, 3, 8, 9, 10, 11) + SPECDEC_SHUFFLE(v8i, a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  const v8f cd = SPECDEC_SHUFFLE(v8i, c, d, 0, 1, 2, 3, 8, 9, 10, 11) + SPECDEC_SHUFFLE(v8i, c, d, 4, 5, 6, 7, 12, 13, 14, 15);
  // [a0+a2, a1+a3, c0+c2, c1+c3, b0+b2, b1+b3, d0+d2, d1+d3] (of the sums above)
  const v8f p = SPECDEC_SHUFFLE(v8i, ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) + SPECDEC_SHUFFLE(v8i, ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);
  // [p0, p4, p2, p6 | p1, p5, p3, p7]: the low half plus the high half
  const v8f t = SPECDEC_SHUFFLE(v8i, p, p, 0, 4, 2, 6, 1, 5, 3, 7);
  return low_part<v4f>(t) + low_part<v4f>(SPECDEC_SHUFFLE(v8i, t, t, 4, 5, 6, 7, 0, 1, 2, 3));
}

// Weight rows per "rows" tile for MB rows of x: 2 * MB * NB accumulators (two halves of 16
// lanes) + NB weight vectors + x + a product fit the 16 ymm registers, and NB divides the
// 64-column blocks. Tried and not faster (noisy 2-core box, 1 thread): one pass per half of the
// lanes with twice the weight rows per tile (M = 1: NB = 8, M >= 3: NB = 2): M = 6 1.2x slower.
constexpr int rows_tile_width(int mb) { return mb == 1 ? 4 : mb <= 3 ? 2 : 1; }
// 8-column vectors per "cols" tile: MB * NV accumulators + NV weight vectors + a broadcast + a
// product fit 16 registers (MB = 6: 12 + 2 + 2).
constexpr int cols_tile_width(int mb) { return mb == 1 ? 8 : mb == 2 ? 4 : 2; }

// Software prefetch this many weight rows ahead of the tile (one line per row per 16-float k
// step), as the AVX-512 path's 6 tiles of 4 rows.
constexpr int kPrefetchRows = 24;

// acc[m][j] += x[m, k:k+8] * w[j, k:k+8] for a tile of MB rows of x and NB weight rows.
template <int MB, int NB>
SPECDEC_INLINE void step(v8f (&acc)[MB][NB], const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t k) {
  v8f wv[NB];
  for (int j = 0; j < NB; ++j) {
    wv[j] = load_vec<v8f>(w + j * ldw + k);
    if (MB > 1) SPECDEC_IN_REGISTER(wv[j]);
  }
  for (int m = 0; m < MB; ++m) {
    v8f xv = load_vec<v8f>(x + m * ldx + k);
    if (NB > 1) SPECDEC_IN_REGISTER(xv);
    for (int j = 0; j < NB; ++j) acc[m][j] += xv * wv[j];
  }
}

// "rows" layout, MB rows of x (from m0) times NB weight rows (from n0).
template <int MB, int NB>
void tile_rows(const Args& a, int64_t m0, int64_t n0) {
  v8f lo[MB][NB], hi[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) lo[m][j] = hi[m][j] = v8f{};
  const float* x = a.x + m0 * a.ldx;
  const float* w = a.w + n0 * a.ldw;
  const int64_t K = a.K, k16 = K - K % 16;
  for (int64_t k = 0; k < k16; k += 16) {
    for (int j = 0; j < NB; ++j) __builtin_prefetch(w + (kPrefetchRows + j) * a.ldw + k);
    step<MB, NB>(lo, x, a.ldx, w, a.ldw, k);      // lanes 0-7
    step<MB, NB>(hi, x, a.ldx, w, a.ldw, k + 8);  // lanes 8-15
  }
  // Epilogue: the lane sums four at a time (as the AVX-512 path: one at a time cost as much as
  // the k loop at K = 128), then the K % 16 tail, bias and residual per output.
  constexpr int T = MB * NB;
  v8f s[T];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) s[m * NB + j] = lo[m][j] + hi[m][j];
  float dot[T];
  int t = 0;
  for (; t + 4 <= T; t += 4) store_vec(dot + t, reduce4(s[t], s[t + 1], s[t + 2], s[t + 3]));
  for (; t < T; ++t) dot[t] = hsum8(s[t]);
  for (int m = 0; m < MB; ++m) {
    const float* xm = x + m * a.ldx;
    float* ym = a.y + (m0 + m) * a.N + n0;
    for (int j = 0; j < NB; ++j) {
      float d = dot[m * NB + j];
      for (int64_t k = k16; k < K; ++k) d += xm[k] * w[j * a.ldw + k];
      ym[j] = finish(a, m0 + m, n0 + j, d);
    }
  }
}

// "cols" layout, MB rows of x (from m0) times NV 8-column vectors (from column n0).
template <int MB, int NV>
void tile_cols(const Args& a, int64_t m0, int64_t n0) {
  v8f acc[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = v8f{};
  const float* x = a.x + m0 * a.ldx;
  for (int64_t k = 0; k < a.K; ++k) {
    const float* wk = a.w + k * a.ldw + n0;
    v8f wv[NV];
    for (int j = 0; j < NV; ++j) {
      wv[j] = load_vec<v8f>(wk + 8 * j);
      if (MB > 1) SPECDEC_IN_REGISTER(wv[j]);
    }
    for (int m = 0; m < MB; ++m) {
      const v8f xb = splat8(x[m * a.ldx + k]);
      for (int j = 0; j < NV; ++j) acc[m][j] += xb * wv[j];
    }
  }
  for (int m = 0; m < MB; ++m) {
    float* y = a.y + (m0 + m) * a.N + n0;
    for (int j = 0; j < NV; ++j) {
      v8f out = acc[m][j];
      if (a.bias) out += load_vec<v8f>(a.bias + n0 + 8 * j);
      if (a.residual) out = load_vec<v8f>(a.residual + (m0 + m) * a.ldr + n0 + 8 * j) + out;
      store_vec(y + 8 * j, out);
    }
  }
}

// Output columns [n0, n1) for x rows [m0, m0 + MB), weight rows layout.
template <int MB>
void block_rows(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int NB = rows_tile_width(MB);
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) tile_rows<MB, NB>(a, m0, n);
  for (; n < n1; ++n) tile_rows<MB, 1>(a, m0, n);
}

// Output columns [n0, n1) for x rows [m0, m0 + MB), columns layout.
template <int MB>
void block_cols(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int NV = cols_tile_width(MB);
  int64_t n = n0;
  for (; n + 8 * NV <= n1; n += 8 * NV) tile_cols<MB, NV>(a, m0, n);
  for (; n + 8 <= n1; n += 8) tile_cols<MB, 1>(a, m0, n);
  if (n < n1) cols_scalar(a, m0, MB, n, n1);
}

}  // namespace
}  // namespace linear
}  // namespace specdec
