// Order-preserving compaction ("left pack") of the values of a row that pass a threshold, with
// AVX2 intrinsics: the selection steps of standardise.h (top-k candidates, top-p candidates).
//
// Why: the plain loop `if (keep(v)) cand[m++] = v` is not vectorised by GCC (a store at a
// data-dependent index), and on the AVX2 box it was ~28% of a top-p row's standardisation
// (perf, 32000 logits). Here 8 values are compared at once and the passing ones are moved to
// the front of the vector by a permutation from a 256-entry table, then stored: the same values
// in the same order as the plain loop, so everything downstream is unchanged.
// Only compiled for AVX2 without AVX-512 (the AVX-512 build keeps its plain loops).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec {

// kLeftPack.idx[mask] lists the set bits of mask (lane numbers, ascending), padded with 0.
struct LeftPackTable {
  alignas(32) int32_t idx[256][8];
  constexpr LeftPackTable() : idx{} {
    for (int mask = 0; mask < 256; ++mask) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane)
        if ((mask >> lane) & 1) idx[mask][k++] = lane;
    }
  }
};
inline constexpr LeftPackTable kLeftPack{};

// cand[m++] = p for p = x[v] * scale, v = 0..n, when p >= t and (if kPositive) p > 0; returns m.
// kScale false: p = x[v] (no multiply). cand needs room for n values.
template <bool kScale, bool kPositive>
inline int64_t left_pack_ge(const float* x, int64_t n, float scale, float t, float* cand) {
  const __m256 vscale = _mm256_set1_ps(scale), vt = _mm256_set1_ps(t), zero = _mm256_setzero_ps();
  const int64_t n8 = n - n % 8;
  int64_t m = 0;
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 p = _mm256_loadu_ps(x + i);
    if (kScale) p = _mm256_mul_ps(p, vscale);
    __m256 keep = _mm256_cmp_ps(p, vt, _CMP_GE_OQ);
    if (kPositive) keep = _mm256_and_ps(keep, _mm256_cmp_ps(p, zero, _CMP_GT_OQ));
    const int mask = _mm256_movemask_ps(keep);
    if (mask == 0) continue;
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLeftPack.idx[mask]));
    // m <= i here, so the 8 floats stored at cand + m stay below cand + n.
    _mm256_storeu_ps(cand + m, _mm256_permutevar8x32_ps(p, perm));
    m += __builtin_popcount(static_cast<unsigned>(mask));
  }
  for (int64_t i = n8; i < n; ++i) {
    const float p = kScale ? x[i] * scale : x[i];
    if (p >= t && (!kPositive || p > 0.0f)) cand[m++] = p;
  }
  return m;
}

}  // namespace specdec
