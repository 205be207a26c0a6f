// Paged attention for N new queries per row on CPU: torch.ops.specdec_fast.paged_attention.
//
// Same semantics as kernels/attention/reference.py: causal, tree or block mask, a sliding window
// or chunked attention (Llama 4's: query i sees keys from (prefix + i) / chunk * chunk on, or
// under a tree from its depth's chunk, its ancestors by their depths; the first visible key is
// `first` in attend_keys either way), soft-capping, sinks.
// One task per (row b, KV head): its n*G
// query rows (n new queries x G heads of the GQA group) walk the row's keys once, in chunks
// of CHUNK keys, so each K/V chunk is converted to fp32 once and reused by every query row
// (scoring K+1 positions costs about one decode step of memory traffic). Fewer tasks than
// threads: each task's keys are cut into ranges, merged at the end (key_splits). Per chunk, each quad
// of query rows is scored, masked, soft-maxed online and multiplied with V in vectors of LANES
// floats (GCC vector extensions; CHUNK = LANES = 16 on AVX-512, 8 on AVX2, 4 elsewhere):
//  - scores: one LANES-wide partial dot product per (row, key), reduced for all the chunk's keys
//    at once by a shuffle tree (transpose_sum). The version before reduced each (row, key) to a
//    scalar on its own, through the stack, and spent most of its time there (perf annotate);
//  - softmax: a row's scores over the chunk are one vector; exp is vec_math's fast_exp on every
//    lane (the version before called std::exp per score, in a branchy loop);
//  - P V: the quad's accumulators stay in registers over the chunk's keys, rescaled once per chunk.
// Measured against the version before, 1 thread, the AMD EPYC dev box (32 q / 8 kv heads, D 128;
// both sources built side by side in one run; bench/results/attention_cpu.json for the shipped
// figures): AVX-512 build 1.3-2.0x at N = 1 and 1.8-2.5x at N = 5 / 16; the same sources built for
// AVX2 (-mno-avx512f) 1.1-1.6x; for plain x86-64 (SSE2) 0.87-1.23x (fp32 at N = 5 / 16 5-9%
// slower). Multiply-adds are fused (fma_v) where the machine has FMA, so the
// last bits differ from the torch reference's (tests compare both with float64 SDPA).
#include "aten_lean.h"
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "vec_math.h"
#include "vec_shuffle.h"

namespace specdec {
namespace attention {
namespace {

// Vector width: one register of the machine, 16 floats (zmm) on AVX-512, 8 (ymm) on AVX2, 4
// otherwise (SSE2; NEON on aarch64). Wider vectors than the registers were measured slower
// than the code before (GCC 12 lowers them through the stack): 16 floats on AVX2 2.7-3.4x,
// 8 on SSE2 ~2x.
#if defined(__AVX512F__)
#define SPECDEC_ATTN_LANES 16
#elif defined(__AVX2__) && defined(__FMA__)  // what _cpp_build.cpu_isa() calls "avx2"
#define SPECDEC_ATTN_LANES 8
#else
#define SPECDEC_ATTN_LANES 4
#endif
constexpr int64_t LANES = SPECDEC_ATTN_LANES;
constexpr int64_t CHUNK = LANES;  // keys per step: one vector of scores per query row
constexpr int64_t ROWS = 4;       // query rows per pass: 4 accumulator chains share each K / V load
// Keys prefetched this many positions ahead: a key's D values are one short run per page slot
// (the cache is [blocks, page, Hkv, D]), which the hardware prefetcher does not follow. Measured
// (1 thread, 8 caches of 16-32 MB read in turn, so from DRAM): bf16 decode 1.08-1.27x faster
// than without, fp32 0.95-1.08x; 32 or 64 positions ahead, or every other key, no better.
constexpr int64_t PREFETCH_AHEAD = 16;

typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

// x in every lane: a broadcast. Not `vf{} + x`: 0 + x is not x for x = -0, so GCC adds in a
// scalar register first (measured: an add + broadcast per key in P V, 25% of the kernel's
// time), and a lane-by-lane fill went through the stack (2x slower still).
SPECDEC_INLINE vf splat(float x) {
  const vf v = {x};
#if SPECDEC_ATTN_LANES == 16
  return SPECDEC_SHUFFLE(vi, v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
#elif SPECDEC_ATTN_LANES == 8
  return SPECDEC_SHUFFLE(vi, v, v, 0, 0, 0, 0, 0, 0, 0, 0);
#else
  return SPECDEC_SHUFFLE(vi, v, v, 0, 0, 0, 0);
#endif
}

// a * b + c, fused where the machine has FMA (the file is built with -ffp-contract=off).
SPECDEC_INLINE vf fma_v(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif SPECDEC_ATTN_LANES == 8
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

#if SPECDEC_ATTN_LANES == 16
// Lane j of the result = the sum of x[j]'s lanes: pairwise merges of two shuffles and an add.
// After merge level t, lane i of a vector holds a partial sum of key (i mod 2^t) of its group.
SPECDEC_INLINE vf transpose_sum(const vf* x) {
  vf a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)
    a[i] = SPECDEC_SHUFFLE(vi, x[2 * i], x[2 * i + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
           SPECDEC_SHUFFLE(vi, x[2 * i], x[2 * i + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  for (int i = 0; i < 4; ++i)
    b[i] = SPECDEC_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           SPECDEC_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  for (int i = 0; i < 2; ++i)
    c[i] = SPECDEC_SHUFFLE(vi, b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           SPECDEC_SHUFFLE(vi, b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  return SPECDEC_SHUFFLE(vi, c[0], c[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
         SPECDEC_SHUFFLE(vi, c[0], c[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}

// The lanes of x folded in halves: lane 0 ends up holding op over all lanes.
#define SPECDEC_FOLD(x, op)                                                                     \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)); \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7));             \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));             \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0))
#elif SPECDEC_ATTN_LANES == 8
SPECDEC_INLINE vf transpose_sum(const vf* x) {
  vf a[4], b[2];
  for (int i = 0; i < 4; ++i)
    a[i] = SPECDEC_SHUFFLE(vi, x[2 * i], x[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           SPECDEC_SHUFFLE(vi, x[2 * i], x[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  for (int i = 0; i < 2; ++i)
    b[i] = SPECDEC_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           SPECDEC_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return SPECDEC_SHUFFLE(vi, b[0], b[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         SPECDEC_SHUFFLE(vi, b[0], b[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

#define SPECDEC_FOLD(x, op)                                 \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 4, 5, 6, 7, 4, 5, 6, 7)); \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 2, 3, 2, 3, 2, 3, 2, 3)); \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 1, 0, 1, 0, 1, 0, 1, 0))
#else
SPECDEC_INLINE vf transpose_sum(const vf* x) {
  const vf a = SPECDEC_SHUFFLE(vi, x[0], x[1], 0, 4, 2, 6) + SPECDEC_SHUFFLE(vi, x[0], x[1], 1, 5, 3, 7);
  const vf b = SPECDEC_SHUFFLE(vi, x[2], x[3], 0, 4, 2, 6) + SPECDEC_SHUFFLE(vi, x[2], x[3], 1, 5, 3, 7);
  return SPECDEC_SHUFFLE(vi, a, b, 0, 1, 4, 5) + SPECDEC_SHUFFLE(vi, a, b, 2, 3, 6, 7);
}

#define SPECDEC_FOLD(x, op)                     \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 2, 3, 2, 3)); \
  op(x, SPECDEC_SHUFFLE(vi, x, x, 1, 0, 1, 0))
#endif

#define SPECDEC_MAX_INTO(x, y) x = x > y ? x : y
#define SPECDEC_ADD_INTO(x, y) x += y

SPECDEC_INLINE float hmax(vf x) {
  SPECDEC_FOLD(x, SPECDEC_MAX_INTO);
  return x[0];
}

SPECDEC_INLINE float hsum(vf x) {
  SPECDEC_FOLD(x, SPECDEC_ADD_INTO);
  return x[0];
}

// vec_math's fast_exp on every lane: its clamps, its exp_mantissa, its 2^n in two exact factors
// (-inf -> 0).
SPECDEC_INLINE vf exp_v(vf x) {
  const vf hi = splat(88.72283935546875f), lo = splat(-104.0f);
  vf xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  vf n;
  const vf y = exp_mantissa(xc, n);
  const vi ni = __builtin_convertvector(n, vi);
  const vi n1 = ni >> 1, n2 = ni - n1;
  const vf out = (y * (vf)((n1 + 127) << 23)) * (vf)((n2 + 127) << 23);
  return x < lo ? splat(0.f) : x > hi ? splat(std::numeric_limits<float>::infinity()) : out;
}

// All lanes set where bit `lane` of `bits` is (an and + compare: SSE2 and AVX2 have no
// per-lane variable shift that would serve every width).
SPECDEC_INLINE vi bit_lanes(uint32_t bits) {
#if SPECDEC_ATTN_LANES == 16
  const vi lane_bit = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
#elif SPECDEC_ATTN_LANES == 8
  const vi lane_bit = {1, 2, 4, 8, 16, 32, 64, 128};
#else
  const vi lane_bit = {1, 2, 4, 8};
#endif
  return ((vi{} + static_cast<int32_t>(bits)) & lane_bit) != 0;
}

// Which of the chunk's keys j0 .. j0 + CHUNK - 1 a query sees, as a CHUNK-bit mask: the first
// `end` of them (its causal window, or the row's length), none before position `first` (a
// sliding window's first key, or the start of the query's attention chunk), and under a tree
// mask, of the row's new tokens only those its bits name (every key before the new tokens stays
// visible).
SPECDEC_INLINE uint32_t visible_keys(int64_t end, int64_t first, bool tree, int64_t bits, int64_t j0, int64_t prefix) {
  constexpr uint32_t all = (1u << CHUNK) - 1u;
  uint32_t vis = end >= CHUNK ? all : end <= 0 ? 0u : (1u << end) - 1u;
  if (first > j0) vis &= first - j0 >= CHUNK ? 0u : ~((1u << (first - j0)) - 1u);
  if (tree) {
    const int64_t first_new = j0 - prefix;  // the chunk's first key, as an index among the new tokens
    uint64_t seen;
    if (first_new >= 0)
      seen = first_new >= 64 ? 0 : static_cast<uint64_t>(bits) >> first_new;
    else
      seen = -first_new >= CHUNK ? ~0ull : (static_cast<uint64_t>(bits) << -first_new) | ((1ull << -first_new) - 1ull);
    vis &= static_cast<uint32_t>(seen) & all;
  }
  return vis;
}

// s[k][j] = q[k] . key[j] for the quad's rows k and the chunk's keys j (0 where j >= cnt).
// q: [ROWS][Dp], keys: [CHUNK][Dp], s: [ROWS][CHUNK]; Dp a multiple of LANES, zero-padded.
SPECDEC_INLINE void score_quad(const float* q, int64_t Dp, const float* keys, int64_t cnt, float* s) {
  vf part[ROWS][CHUNK];
  for (int64_t j = 0; j < CHUNK; ++j) {
    vf a0 = {}, a1 = {}, a2 = {}, a3 = {};
    if (j < cnt) {
      const float* k = keys + j * Dp;
      for (int64_t d = 0; d < Dp; d += LANES) {
        const vf kv = load_vec<vf>(k + d);
        a0 = fma_v(load_vec<vf>(q + d), kv, a0);
        a1 = fma_v(load_vec<vf>(q + Dp + d), kv, a1);
        a2 = fma_v(load_vec<vf>(q + 2 * Dp + d), kv, a2);
        a3 = fma_v(load_vec<vf>(q + 3 * Dp + d), kv, a3);
      }
    }
    part[0][j] = a0;
    part[1][j] = a1;
    part[2][j] = a2;
    part[3][j] = a3;
  }
  for (int64_t r = 0; r < ROWS; ++r) store_vec(s + r * CHUNK, transpose_sum(part[r]));
}

// One quad of query rows over one chunk of keys: scores, the mask, the online softmax (m: the
// running max, l: the running sum, acc rescaled by exp(m_old - m_new)) and P V.
// q, acc: [ROWS][Dp]; m, l: [ROWS]; keys, vals: [CHUNK][Dp] (rows >= cnt unread by P V);
// vis: [ROWS] key masks (0: the row sees nothing here, or is padding); softcap > 0: each score
// s becomes softcap * tanh(s / softcap) (Gemma 2), a vector of scores at a time as
// c - 2c / (exp(2 s / c) + 1) with exp_v (exp -> inf gives c, -> 0 gives -c). The cap's cost over
// the uncapped pass (bench_attention.py --cpu-window, 1 thread, fp32, this 2-core EPYC, 32 q / 8 kv
// heads, D 128): 1.01-1.06x (commit 2af03b7, attention_window_cpu.json), against 1.18-1.60x with
// std::tanh per score (measured at 49369b0).
SPECDEC_INLINE void attend_quad(const float* q, float* acc, float* m, float* l, int64_t Dp, const float* keys,
                                const float* vals, int64_t cnt, const uint32_t* vis, float softcap) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(64) float p[ROWS * CHUNK];
  float alpha[ROWS];
  score_quad(q, Dp, keys, cnt, p);
  if (softcap > 0.f) {
    const vf two_over_c = splat(2.f / softcap), c = splat(softcap), two_c = splat(2.f * softcap), one = splat(1.f);
    for (int64_t r = 0; r < ROWS; ++r) {
      const vf e = exp_v(load_vec<vf>(p + r * CHUNK) * two_over_c);
      store_vec(p + r * CHUNK, c - two_c / (e + one));
    }
  }
  for (int64_t r = 0; r < ROWS; ++r) {
    if (vis[r] == 0) {
      store_vec(p + r * CHUNK, splat(0.f));
      alpha[r] = 1.f;
      continue;
    }
    const vf s = bit_lanes(vis[r]) ? load_vec<vf>(p + r * CHUNK) : splat(neg_inf);
    const float m_new = std::max(m[r], hmax(s));
    alpha[r] = fast_exp(m[r] - m_new);  // m = -inf -> 0
    const vf e = exp_v(s - m_new);       // masked keys: exp(-inf) = 0
    store_vec(p + r * CHUNK, e);
    l[r] = l[r] * alpha[r] + hsum(e);
    m[r] = m_new;
  }
  for (int64_t d = 0; d < Dp; d += LANES) {
    vf a0 = load_vec<vf>(acc + d) * alpha[0], a1 = load_vec<vf>(acc + Dp + d) * alpha[1];
    vf a2 = load_vec<vf>(acc + 2 * Dp + d) * alpha[2], a3 = load_vec<vf>(acc + 3 * Dp + d) * alpha[3];
    // Not unrolled: GCC otherwise peels the <= CHUNK keys completely and keeps their 4 x CHUNK
    // broadcasts of p on the stack (measured 1.25-1.4x slower).
#pragma GCC unroll 1
    for (int64_t j = 0; j < cnt; ++j) {
      const vf x = load_vec<vf>(vals + j * Dp + d);
      a0 = fma_v(splat(p[j]), x, a0);
      a1 = fma_v(splat(p[CHUNK + j]), x, a1);
      a2 = fma_v(splat(p[2 * CHUNK + j]), x, a2);
      a3 = fma_v(splat(p[3 * CHUNK + j]), x, a3);
    }
    store_vec(acc + d, a0);
    store_vec(acc + Dp + d, a1);
    store_vec(acc + 2 * Dp + d, a2);
    store_vec(acc + 3 * Dp + d, a3);
  }
}

template <typename scalar_t>
SPECDEC_INLINE void to_float(float* dst, const scalar_t* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// The op's inputs as raw pointers and strides.
template <typename scalar_t>
struct Problem {
  int64_t B, Hq, D, Dp, page, Hkv, G;
  const scalar_t *qp, *kp, *vp;
  const int32_t *bt, *lens, *cu;
  const int64_t* tree;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2, bts;
  float scale;
  bool causal;
  int64_t window;  // 0: none
  int64_t chunk;   // chunked attention's chunk (Llama 4), 0: none; never with a window
  float softcap;   // 0: none
  const float* sinks;  // [Hq] logits, one more term of each query head's softmax (GPT-OSS), or nullptr
};

// A query's position among its row's new tokens: i, or under a tree its depth (the ancestors
// its bits name besides itself).
SPECDEC_INLINE int64_t query_offset(int64_t i, bool tree, int64_t bits) {
  return tree ? __builtin_popcountll(static_cast<uint64_t>(bits)) - 1 : i;
}

// The first key any query of row b may see: its window's start for query offset 0, or with
// chunked attention the start of query 0's attention chunk, (prefix / chunk) * chunk; rounded
// down to a CHUNK of keys (0 with neither). Keys before it are never read.
template <typename scalar_t>
SPECDEC_INLINE int64_t first_key(const Problem<scalar_t>& P, int64_t b) {
  if (P.window <= 0 && P.chunk <= 0) return 0;
  const int64_t prefix = P.lens[b] - (P.cu[b + 1] - P.cu[b]);
  if (P.chunk > 0) return prefix / P.chunk * P.chunk / CHUNK * CHUNK;
  return std::max<int64_t>(0, prefix - P.window + 1) / CHUNK * CHUNK;
}

// One thread's working set: the task's query rows, their running state, one chunk of K and V.
// Padding (rows to a quad, D to Dp) stays zero: padded rows score 0 and are masked out.
struct Buffers {
  std::vector<float> q, acc, m, l, k, v;
  explicit Buffers(int64_t Dp) : k(CHUNK * Dp, 0.f), v(CHUNK * Dp, 0.f) {}
};

// Row b's queries of KV head h over its keys [begin, end) (begin a multiple of CHUNK): leaves
// the unnormalised state in t (acc [R][Dp], m and l [R], R = n * G rows: r = i * G + g is
// query i, head h * G + g). An empty range leaves acc = 0, m = -inf, l = 0.
template <typename scalar_t>
void attend_keys(const Problem<scalar_t>& P, int64_t b, int64_t h, int64_t begin, int64_t end, Buffers& t) {
  const int64_t q0 = P.cu[b], n = P.cu[b + 1] - P.cu[b], L = P.lens[b], prefix = L - n;
  const int64_t G = P.G, Dp = P.Dp, D = P.D;
  const int64_t R = n * G, Rp = (R + ROWS - 1) / ROWS * ROWS;
  t.q.assign(Rp * Dp, 0.f);
  t.acc.assign(Rp * Dp, 0.f);
  t.m.assign(Rp, -std::numeric_limits<float>::infinity());
  t.l.assign(Rp, 0.f);
  for (int64_t r = 0; r < R; ++r) {
    const scalar_t* src = P.qp + ((q0 + r / G) * P.Hq + h * G + r % G) * D;
    float* dst = &t.q[r * Dp];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * P.scale;
  }
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(scalar_t));
  const int32_t* table = P.bt + b * P.bts;
  for (int64_t j0 = begin; j0 < end; j0 += CHUNK) {
    const int64_t cnt = std::min<int64_t>(CHUNK, end - j0);
    // gather the chunk's keys and values as fp32
    for (int64_t j = 0; j < cnt; ++j) {
      const int64_t pos = j0 + j, phys = table[pos / P.page], slot = pos % P.page;
      to_float(&t.k[j * Dp], P.kp + phys * P.ks0 + slot * P.ks1 + h * P.ks2, D);
      to_float(&t.v[j * Dp], P.vp + phys * P.vs0 + slot * P.vs1 + h * P.vs2, D);
    }
    for (int64_t pos = j0 + PREFETCH_AHEAD, stop = std::min<int64_t>(end, pos + CHUNK); pos < stop; ++pos) {
      const int64_t phys = table[pos / P.page], slot = pos % P.page;
      const char* kr = reinterpret_cast<const char*>(P.kp + phys * P.ks0 + slot * P.ks1 + h * P.ks2);
      const char* vr = reinterpret_cast<const char*>(P.vp + phys * P.vs0 + slot * P.vs1 + h * P.vs2);
      for (int64_t byte = 0; byte < row_bytes; byte += 64) {
        __builtin_prefetch(kr + byte);
        __builtin_prefetch(vr + byte);
      }
    }
    // rows whose causal window reaches this chunk: i >= j0 - prefix (every row: the block mask)
    const int64_t first_row = P.causal ? std::max<int64_t>(0, j0 - prefix) * G : 0;
    for (int64_t r0 = first_row / ROWS * ROWS; r0 < R; r0 += ROWS) {
      uint32_t vis[ROWS], any = 0;
      for (int64_t k = 0; k < ROWS; ++k) {
        const int64_t r = r0 + k, i = r / G;
        const bool seen = r >= first_row && r < R;
        const int64_t bits = seen && P.tree ? P.tree[q0 + i] : 0;
        const int64_t last = !seen ? 0 : P.causal ? std::min<int64_t>(cnt, prefix + i + 1 - j0) : cnt;
        // the query's first visible key: its window's start, or its attention chunk's; the query sits at
        // prefix + i, or under a tree at prefix + its depth
        const int64_t position = prefix + query_offset(i, P.tree != nullptr, bits);
        const int64_t first = P.chunk > 0    ? position / P.chunk * P.chunk
                              : P.window > 0 ? position - P.window + 1
                                             : 0;
        // a tree under a chunk: an ancestor sits at prefix + its depth, which is not its slot; the
        // ancestors of depth below first - prefix are hidden -- its lowest set bits (BFS order: an
        // ancestor's slot grows with its depth) -- so the bits lose that many
        int64_t seen_bits = bits;
        if (P.chunk > 0 && P.tree != nullptr)
          for (int64_t drop = first - prefix; drop > 0 && seen_bits != 0; --drop) seen_bits &= seen_bits - 1;
        vis[k] = visible_keys(last, first, P.tree != nullptr, seen_bits, j0, prefix);
        any |= vis[k];
      }
      if (any == 0) continue;  // the quad's rows see none of the chunk (a window or an attention chunk
                               // starts past it): no state changes
      attend_quad(&t.q[r0 * Dp], &t.acc[r0 * Dp], &t.m[r0], &t.l[r0], Dp, t.k.data(), t.v.data(), cnt, vis,
                  P.softcap);
    }
  }
}

// out rows of (b, h) = acc / l (0 where l = 0: a row that saw no key); with sinks, l also counts
// e^(sink - m) and acc is rescaled to the new maximum (m: each row's running max, natural units).
template <typename scalar_t>
void write_rows(const Problem<scalar_t>& P, int64_t b, int64_t h, const float* acc, const float* m, const float* l,
                scalar_t* op) {
  const int64_t q0 = P.cu[b], R = (P.cu[b + 1] - q0) * P.G;
  for (int64_t r = 0; r < R; ++r) {
    scalar_t* dst = op + ((q0 + r / P.G) * P.Hq + h * P.G + r % P.G) * P.D;
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    if (P.sinks != nullptr && l[r] > 0.f) {
      const float sink = P.sinks[h * P.G + r % P.G], top = std::max(m[r], sink);
      const float keep = std::exp(m[r] - top);  // acc and l rescaled to the max over keys and sink
      inv = keep / (l[r] * keep + std::exp(sink - top));
    }
    for (int64_t d = 0; d < P.D; ++d) dst[d] = static_cast<scalar_t>(acc[r * P.Dp + d] * inv);
  }
}

// Keys per split at least: a split re-reads the task's queries and is merged at the end.
constexpr int64_t MIN_SPLIT_KEYS = 256;

// How many key ranges each (row, head) task is cut into: 1 while there are at least as many
// tasks as threads; else enough ranges to give every thread work (flash-decoding). With one
// task per (row, KV head) alone, a decode step at B = 1 of a model with 2 KV heads (the demo
// pair; Qwen2.5-0.5B to 3B) kept 2 threads busy however many the machine had. Measured with one
// KV head at 2 threads (this 2-core box, both sources built side by side): 1.8-2.0x at 1024-8192
// keys, N = 1 / 5 / 16; at 1 thread, where nothing is split, 0.95-0.99x.
inline int64_t key_splits(int64_t tasks, int64_t threads, int64_t max_len) {
  if (tasks <= 0 || tasks >= threads) return 1;
  return std::max<int64_t>(1, std::min((threads + tasks - 1) / tasks, max_len / MIN_SPLIT_KEYS));
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_table,
         const at::Tensor& seq_lens, const at::Tensor& cu_query_lens, const c10::optional<at::Tensor>& tree_mask,
         double scale, bool causal, int64_t window, double softcap, const c10::optional<at::Tensor>& sinks,
         int64_t chunk, at::Tensor& out) {
  Problem<scalar_t> P;
  P.B = block_table.size(0);
  P.Hq = q.size(1), P.D = q.size(2), P.Dp = (P.D + LANES - 1) / LANES * LANES;
  P.page = k_cache.size(1), P.Hkv = k_cache.size(2), P.G = P.Hq / P.Hkv;
  P.qp = q.data_ptr<scalar_t>(), P.kp = k_cache.data_ptr<scalar_t>(), P.vp = v_cache.data_ptr<scalar_t>();
  P.bt = block_table.data_ptr<int32_t>(), P.lens = seq_lens.data_ptr<int32_t>(), P.cu = cu_query_lens.data_ptr<int32_t>();
  P.tree = tree_mask.has_value() ? tree_mask->data_ptr<int64_t>() : nullptr;
  P.ks0 = k_cache.stride(0), P.ks1 = k_cache.stride(1), P.ks2 = k_cache.stride(2);
  P.vs0 = v_cache.stride(0), P.vs1 = v_cache.stride(1), P.vs2 = v_cache.stride(2);
  P.bts = block_table.stride(0);
  P.scale = static_cast<float>(scale);
  P.causal = causal;
  P.window = window;
  P.chunk = chunk;
  P.softcap = static_cast<float>(softcap);
  P.sinks = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  scalar_t* op = out.data_ptr<scalar_t>();
  const int64_t B = P.B, Hkv = P.Hkv;

  int64_t max_len = 0, max_rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    max_len = std::max<int64_t>(max_len, P.lens[b] - first_key(P, b));
    max_rows = std::max<int64_t>(max_rows, (P.cu[b + 1] - P.cu[b]) * P.G);
  }
  const int64_t splits = key_splits(B * Hkv, omp_get_max_threads(), max_len);

  if (splits == 1) {
#pragma omp parallel
    {
      Buffers t(P.Dp);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < Hkv; ++h) {
          if (P.cu[b + 1] <= P.cu[b]) continue;
          attend_keys(P, b, h, first_key(P, b), P.lens[b], t);
          write_rows(P, b, h, t.acc.data(), t.m.data(), t.l.data(), op);
        }
      }
    }
    return;
  }
  // Each split's unnormalised state, then one merge per (row, head):
  // out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
  const int64_t slot_acc = max_rows * P.Dp, slot = slot_acc + 2 * max_rows;
  std::vector<float> part(B * Hkv * splits * slot);
#pragma omp parallel
  {
    Buffers t(P.Dp);
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t s = 0; s < splits; ++s) {
          const int64_t R = (P.cu[b + 1] - P.cu[b]) * P.G, L = P.lens[b], start = first_key(P, b);
          if (R <= 0) continue;
          const int64_t span = ((L - start + splits - 1) / splits + CHUNK - 1) / CHUNK * CHUNK;
          const int64_t begin = std::min(L, start + s * span), end = std::min(L, begin + span);
          attend_keys(P, b, h, begin, end, t);
          float* dst = &part[((b * Hkv + h) * splits + s) * slot];
          std::copy(t.acc.begin(), t.acc.begin() + R * P.Dp, dst);
          std::copy(t.m.begin(), t.m.begin() + R, dst + slot_acc);
          std::copy(t.l.begin(), t.l.begin() + R, dst + slot_acc + max_rows);
        }
      }
    }
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t R = (P.cu[b + 1] - P.cu[b]) * P.G;
        if (R <= 0) continue;
        const float* first = &part[(b * Hkv + h) * splits * slot];
        std::vector<float> acc(R * P.Dp, 0.f), l(R, 0.f), maxes(R, -std::numeric_limits<float>::infinity());
        for (int64_t r = 0; r < R; ++r) {
          float M = -std::numeric_limits<float>::infinity();
          for (int64_t s = 0; s < splits; ++s) M = std::max(M, first[s * slot + slot_acc + r]);
          maxes[r] = M;
          if (M == -std::numeric_limits<float>::infinity()) continue;  // no key seen: out 0
          for (int64_t s = 0; s < splits; ++s) {
            const float* part_s = first + s * slot;
            const float w = fast_exp(part_s[slot_acc + r] - M);  // an empty split: exp(-inf) = 0
            l[r] += part_s[slot_acc + max_rows + r] * w;
            for (int64_t d = 0; d < P.Dp; ++d) acc[r * P.Dp + d] += part_s[r * P.Dp + d] * w;
          }
        }
        write_rows(P, b, h, acc.data(), maxes.data(), l.data(), op);
      }
    }
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& cu_query_lens,
                           const c10::optional<at::Tensor>& tree_mask, double scale, bool causal, int64_t window,
                           double softcap, const c10::optional<at::Tensor>& sinks, int64_t chunk) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "paged_attention: q must be a contiguous [T, Hq, D] tensor");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_attention: k_cache/v_cache shape");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "paged_attention: caches need stride(-1) == 1");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "paged_attention: cache dtype must match q");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0, "paged_attention: head shapes");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.stride(1) == 1,
              "paged_attention: block_table must be int32 [B, max_blocks] with stride(1) == 1");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() && seq_lens.size(0) == block_table.size(0),
              "paged_attention: seq_lens must be contiguous int32 [B]");
  TORCH_CHECK(cu_query_lens.scalar_type() == at::kInt && cu_query_lens.is_contiguous() &&
                  cu_query_lens.size(0) == block_table.size(0) + 1,
              "paged_attention: cu_query_lens must be contiguous int32 [B+1]");
  if (tree_mask.has_value())
    TORCH_CHECK(tree_mask->scalar_type() == at::kLong && tree_mask->is_contiguous() && tree_mask->size(0) == q.size(0),
                "paged_attention: tree_mask must be contiguous int64 [T]");
  TORCH_CHECK(window >= 0 && softcap >= 0.0 && chunk >= 0,
              "paged_attention: window, softcap and chunk must be >= 0 (0: none)");
  TORCH_CHECK(chunk == 0 || window == 0, "paged_attention: chunk takes no window");
  if (sinks.has_value())
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->dim() == 1 &&
                    sinks->size(0) == q.size(1),
                "paged_attention: sinks must be contiguous float32 [Hq]");
  at::Tensor out = at::zeros_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_attention", [&] {
    run<scalar_t>(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale, causal, window, softcap,
                  sinks, chunk, out);
  });
  return out;
}

}  // namespace
}  // namespace attention
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor cu_query_lens, Tensor? tree_mask, float scale, bool causal=True, int window=0, float softcap=0.0, "
      "Tensor? sinks=None, int chunk=0) -> Tensor");
  // The vector width this build attends with (16 AVX-512, 8 AVX2, 4 otherwise), for tests.
  m.def("paged_attention_lanes() -> int", []() -> int64_t { return specdec::attention::LANES; });
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) { m.impl("paged_attention", &specdec::attention::paged_attention); }
