// The arguments of one skinny_linear call as its tile kernels read them (csrc/skinny_linear.cpp).
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

}  // namespace
}  // namespace linear
}  // namespace specdec
