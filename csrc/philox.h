// Philox4x32-10 and the float maps of kernels/rng (the spec), for the C++ CPU backend.
//
// Every random number is a pure function of (seed, offset, position, stream, vocab index):
//   key     = (seed lo32, seed hi32)
//   counter = (vocab_index / 4, position, offset lo32, (offset >> 32) << 8 | stream)
// and output word vocab_index % 4 of the four 32-bit outputs is used: one Philox call serves four
// consecutive vocab indices (gumbel_block). Bit-exact with kernels/rng/reference.py (checked by
// tests/kernels/test_rng_cpp.py).
//
// Everything here is plain integer/float code with no branches, so loops that call these
// inline functions over the vocab are auto-vectorised by GCC (-O3 -march=native).
#pragma once

#include <cstdint>
#include <cstring>

// AVX2 without AVX-512: Philox through intrinsics (philox_bits8_avx2, gumbel_block). The AVX-512
// build keeps its plain, auto-vectorised loops (and so its machine code) unchanged.
#if defined(__AVX2__) && !defined(__AVX512F__)
#define SPECDEC_PHILOX_AVX2 1
#include <immintrin.h>
#endif

#include "vec_math.h"

namespace specdec {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

constexpr int kStreamAccept = 0;  // accept coins u_i, vocab index 0
constexpr int kStreamToken = 1;   // Gumbel noise of the emitted token
constexpr int kStreamDraft = 2;   // Gumbel noise of the drafter's own sampling

// The fixed part of a Philox counter/key for one (seed, offset, position, stream).
struct PhiloxKey {
  uint32_t k0, k1;  // key
  uint32_t c1, c2, c3;  // counter words 1..3 (word 0 is the vocab index)
};

inline PhiloxKey philox_key(int64_t seed, int64_t offset, int64_t position, int stream) {
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint64_t o = static_cast<uint64_t>(offset);
  PhiloxKey key;
  key.k0 = static_cast<uint32_t>(s);
  key.k1 = static_cast<uint32_t>(s >> 32);
  key.c1 = static_cast<uint32_t>(static_cast<uint64_t>(position));
  key.c2 = static_cast<uint32_t>(o);
  key.c3 = static_cast<uint32_t>(((o >> 32) << 8) | static_cast<uint32_t>(stream));
  return key;
}

// The four outputs of Philox for counter word 0 = group under key (w[0..3]).
SPECDEC_INLINE void philox_words(const PhiloxKey& key, uint32_t group, uint32_t* w) {
  uint32_t c0 = group, c1 = key.c1, c2 = key.c2, c3 = key.c3;
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(c0) * kPhiloxM0;
    const uint64_t p1 = static_cast<uint64_t>(c2) * kPhiloxM1;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

// The 32-bit draw of the spec for vocab index v under key: word v % 4 of Philox for group v / 4.
SPECDEC_INLINE uint32_t philox_bits(const PhiloxKey& key, uint64_t v) {
  uint32_t w[4];
  philox_words(key, static_cast<uint32_t>(v >> 2), w);
  return w[v & 3];
}

// [0, 1) with 24 random bits, exact.
SPECDEC_INLINE float uniform_from_bits(uint32_t x) {
  return static_cast<float>(static_cast<int32_t>(x >> 8)) * 0x1p-24f;
}

// (0, 1), exact: odd multiples of 2^-24.
SPECDEC_INLINE float uniform_open_from_bits(uint32_t x) {
  return static_cast<float>(static_cast<int32_t>((x >> 9) * 2u + 1u)) * 0x1p-24f;
}

// Standard Gumbel noise -log(-log(U)), U = uniform_open(x).
SPECDEC_INLINE float gumbel_from_bits(uint32_t x) { return -fast_log(-fast_log(uniform_open_from_bits(x))); }

#if defined(SPECDEC_PHILOX_AVX2)
// hi and lo 32 bits of the eight products a[l] * m (m the same in every lane), in lanes. The
// odd lanes are shifted down and multiplied apart (vpmuludq multiplies the even ones); halves
// are put back with in-lane blends. GCC's own vectorisation of philox_bits on AVX2 shuffled
// across 128-bit halves (vperm2i128, vpermq: ~350 instructions per 8 draws).
SPECDEC_INLINE void mul_hi_lo_avx2(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// philox_words(key, g0 + l) for l = 0..7, the same integer arithmetic lane by lane: word t in w[t].
SPECDEC_INLINE void philox_words8_avx2(const PhiloxKey& key, uint32_t g0, __m256i* w) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0)), m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(g0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c1 = _mm256_set1_epi32(static_cast<int>(key.c1)), c2 = _mm256_set1_epi32(static_cast<int>(key.c2));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(key.c3));
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < kPhiloxRounds; ++r) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo_avx2(c0, m0, hi0, lo0);
    mul_hi_lo_avx2(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}
#endif  // SPECDEC_PHILOX_AVX2

// The draws of groups g0 .. g0 + groups - 1, in order: bits[4 j + t] = word t of group g0 + j (the
// spec's draw of vocab index 4 (g0 + j) + t). AVX2: eight groups per philox_words8_avx2 call (Philox
// 205 -> 91 us per 32000 calls, one thread); else a loop over the groups that GCC vectorises, writing
// each group's words side by side (a first version that stored word t of group j at w[t][j] did not
// vectorise on AVX-512: the C++ sampler took 3.8x its time before the four-words noise).
constexpr int64_t kNoiseGroups = 72;
SPECDEC_INLINE void noise_bits(const PhiloxKey& key, int64_t g0, int64_t groups, uint32_t* bits) {
#if defined(SPECDEC_PHILOX_AVX2)
  for (int64_t j = 0; j < groups; j += 8) {
    __m256i words[4];
    philox_words8_avx2(key, static_cast<uint32_t>(g0 + j), words);
    alignas(32) uint32_t w[4][8];
    for (int t = 0; t < 4; ++t) _mm256_store_si256(reinterpret_cast<__m256i*>(w[t]), words[t]);
    for (int l = 0; l < 8; ++l)
      for (int t = 0; t < 4; ++t) bits[4 * (j + l) + t] = w[t][l];
  }
#else
  for (int64_t j = 0; j < groups; ++j) philox_words(key, static_cast<uint32_t>(g0 + j), bits + 4 * j);
#endif
}

// g[i] = gumbel_from_bits(philox_bits(key, v0 + i)) for i < n: one Philox call per four indices
// (the words of group (v0 + i) / 4 in order), then the floats. Any v0 and n.
SPECDEC_INLINE void gumbel_block(const PhiloxKey& key, int64_t v0, int64_t n, float* g) {
  constexpr int64_t kSpan = 4 * (kNoiseGroups - 8);  // indices a pass covers with room for v0 % 4 and rounding to 8
  alignas(64) uint32_t bits[4 * kNoiseGroups];
  for (int64_t c = 0; c < n; c += kSpan) {
    const int64_t m = n - c < kSpan ? n - c : kSpan, first = v0 + c, skip = first & 3;
    noise_bits(key, first >> 2, (skip + m + 3) >> 2, bits);
    const uint32_t* b = bits + skip;
    for (int64_t i = 0; i < m; ++i) g[c + i] = gumbel_from_bits(b[i]);
  }
}

}  // namespace specdec
