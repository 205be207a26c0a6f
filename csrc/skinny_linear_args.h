// The arguments of one skinny_linear call as its tile kernels read them (csrc/skinny_linear.cpp),
// and the scalar pieces both ISAs' tiles share.
#pragma once

#include <cstdint>

#include "vec_math.h"

namespace specdec {
namespace linear {
namespace {

struct Args {
  const float* x;
  int64_t ldx;  // x row stride
  const float* w;
  int64_t ldw;  // rows layout: W row stride; cols layout: stride between k rows of W^T
  const float* bias;      // [N] or nullptr
  const float* residual;  // [M, N] (row stride ldr) or nullptr
  int64_t ldr;
  float* y;  // [M, N] contiguous
  int64_t M, N, K;
};

SPECDEC_INLINE float finish(const Args& a, int64_t m, int64_t n, float dot) {
  float out = a.bias ? dot + a.bias[n] : dot;
  return a.residual ? a.residual[m * a.ldr + n] + out : out;
}

// "cols" layout, single columns [n0, n1) (the tail past the last whole vector of either ISA's
// tiles): scalar, strided reads.
void cols_scalar(const Args& a, int64_t m0, int mb, int64_t n0, int64_t n1) {
  for (int m = 0; m < mb; ++m) {
    const float* x = a.x + (m0 + m) * a.ldx;
    for (int64_t n = n0; n < n1; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < a.K; ++k) s += x[k] * a.w[k * a.ldw + n];
      a.y[(m0 + m) * a.N + n] = finish(a, m0 + m, n, s);
    }
  }
}

}  // namespace
}  // namespace linear
}  // namespace specdec
