// Vector shuffles that compile on every GCC the C++ backend supports (9 and later) and clang.
//
// GCC 12 added __builtin_shufflevector. GCC 9-11 (Ubuntu 22.04 ships 11.4) have only
// __builtin_shuffle, which takes the lanes as an integer vector and returns as many lanes as its
// input: with __builtin_shufflevector written out, the whole library failed to compile there and
// every CPU kernel fell back to the torch reference.
//
// SPECDEC_SHUFFLE(I, a, b, lanes...): lanes of a, then of b (index n + i is b's lane i for n-lane
// inputs); the result has a's lane count, and I is the integer vector type with that count.
// Fewer lanes out: shuffle at full width, then take the low part (low_half, low_quarter).
// -DSPECDEC_NO_SHUFFLEVECTOR forces the GCC 9-11 spelling on a newer GCC (the tests build it so).
//
// Also the GCC float vectors' loads and stores (load_vec / store_vec), which paged_attention and
// both skinny_linear tile headers use.
#pragma once

#include <cstring>

#if defined(__clang__) || (__GNUC__ >= 12 && !defined(SPECDEC_NO_SHUFFLEVECTOR))
#define SPECDEC_SHUFFLE(I, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SPECDEC_SHUFFLE(I, a, b, ...) __builtin_shuffle(a, b, I{__VA_ARGS__})
#endif

namespace specdec {

// The first sizeof(Out) bytes of v as an Out vector (a register move once inlined).
template <typename Out, typename In>
inline __attribute__((always_inline)) Out low_part(In v) {
  static_assert(sizeof(Out) <= sizeof(In), "low_part narrows");
  Out out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

// p[0, lanes) as a V vector, and back. memcpy: no alignment assumed; one unaligned move once inlined.
template <typename V>
inline __attribute__((always_inline)) V load_vec(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V>
inline __attribute__((always_inline)) void store_vec(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace specdec
