// Branch-free float helpers (exp, log, bf16/fp16 -> fp32) that GCC auto-vectorises.
//
// Why not at::vec::Vectorized<float>: in an extension built outside ATen's dispatch, the
// CPU_CAPABILITY_AVX2/AVX512 macros are not defined, so Vectorized<float> is the generic
// 8-lane array fallback whose exp()/log() call std::exp/std::log lane by lane. Measured on the
// 2-core AMD EPYC (AVX-512) dev box, one thread, over a 32000-float row (scratch benchmark,
// not shipped): exp + sum 106 us with Vectorized<float>, 18 us with fast_exp in a plain loop
// (auto-vectorised to 16 lanes); log 115 us vs 22 us with fast_log.
//
// Both functions are Cephes-style (range reduction + polynomial, <= ~1 ulp off the correctly
// rounded value, like torch's own vectorised exp/log), handle -inf/0/subnormals, and use
// no FMA contraction (-ffp-contract=off), so results do not depend on the vector width.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

// Force inlining: in a -fPIC shared library GCC may otherwise keep fast_exp as a call through
// the PLT inside large functions, which stops the loops from vectorising (measured: the whole
// chain_verify op 4x slower).
#define SPECDEC_INLINE inline __attribute__((always_inline))

namespace specdec {

SPECDEC_INLINE float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

SPECDEC_INLINE uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// c ? a : b through integer masks. A plain `c ? constant : computed` lets GCC sink the
// computation into a branch; with the default -ftrapping-math it then will not if-convert the
// loop, and the loop stays scalar (measured: fast_log over a row 10x slower).
SPECDEC_INLINE float select(bool c, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return bits_to_float((float_to_bits(a) & mask) | (float_to_bits(b) & ~mask));
}

// fast_exp's range reduction and polynomial for xc already clamped to [-104, 88.72]: returns y and
// sets n so that exp(xc) = y * 2^n. T is float, or a GCC float vector (paged_attention.cpp's
// exp_v): the same float operations in the same order for each, so every form gives the same bits.
template <typename T>
SPECDEC_INLINE T exp_mantissa(T xc, T& n) {
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // r = x - n ln2 in two steps (Cephes' split of ln2): |r| <= ln2 / 2.
  T r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const T z = r * r;
  T y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  return y * z + r + 1.0f;
}

// y * 2^n (n integral, from exp_mantissa) as two exact power-of-two factors, so results in the
// subnormal range round once.
SPECDEC_INLINE float times_pow2(float y, float n) {
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  return (y * s1) * s2;
}

// fast_log's split of xs = x (times 2^23 where x is subnormal) into m in [0.5, 1) and e with
// x = m 2^e: integer work only, the same in both forms below.
SPECDEC_INLINE float log_split(float xs, bool subnormal, int32_t& e) {
  const uint32_t b = float_to_bits(xs);
  e = static_cast<int32_t>((b >> 23) & 0xFFu) - 126;  // xs = m 2^e, m in [0.5, 1)
  e = subnormal ? e - 23 : e;
  return bits_to_float((b & 0x007FFFFFu) | 0x3F000000u);
}

// fast_log's polynomial: log(m 2^e) for f = m - 1 reduced to [sqrt(1/2) - 1, sqrt(2) - 1] and e.
SPECDEC_INLINE float log_polynomial(float f, int32_t e) {
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  const float ef = static_cast<float>(e);
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  return (f + y) + ef * 0.693359375f;
}

// fast_log's special inputs: 0 -> -inf, +inf -> +inf, x < 0 or NaN -> NaN ('|': no branch).
SPECDEC_INLINE float log_specials(float x, float out) {
  out = select(x == 0.0f, kNegInf, out);
  out = select(x == std::numeric_limits<float>::infinity(), x, out);
  return select((x < 0.0f) | (x != x), std::numeric_limits<float>::quiet_NaN(), out);
}

#if defined(__AVX512F__)
// The AVX-512 build keeps these exact sources (and so its machine code): GCC if-converts the
// ternaries below with mask registers and vectorises the loops at 16 lanes.
// exp(x) for any float x: -inf -> 0, x > 88.72 -> +inf, subnormal results rounded once.
SPECDEC_INLINE float fast_exp(float x) {
  const float hi = 88.72283935546875f, lo = -104.0f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  float n;
  const float y = exp_mantissa(xc, n);
  float out = times_pow2(y, n);
  out = select(x > hi, std::numeric_limits<float>::infinity(), out);
  return select(x < lo, 0.0f, out);
}

// log(x): 0 -> -inf, x < 0 or NaN -> NaN, +inf -> +inf, subnormal inputs handled.
SPECDEC_INLINE float fast_log(float x) {
  // Selects pick constants, never the results of float ops (see select()).
  const bool subnormal = x < 1.17549435e-38f;
  const float xs = x * (subnormal ? 8388608.0f : 1.0f);  // * 2^23
  int32_t e;
  const float m = log_split(xs, subnormal, e);
  const bool small = m < 0.707106781186547524f;
  e = small ? e - 1 : e;
  const float f = m * (small ? 2.0f : 1.0f) - 1.0f;  // exact (Sterbenz)
  return log_specials(x, log_polynomial(f, e));
}
#else
// AVX2 (and generic) build: the same float operations in the same order, so the results are
// bit-identical to the AVX-512 versions above, but every choice is an integer-mask select().
// Why: without mask registers GCC 12 (-march=native on Zen 4 with AVX-512 hidden, avx2 + fma)
// turned `x > hi ? hi : x` next to `select(x > hi, ...)`, and `x * (c ? k1 : k2)`, into
// branches and then refused to vectorise any loop calling these ("control flow in loop"):
// exp over a 32000-float row took 189 us (scalar), 23 us once vectorised (8 lanes).

// exp(x) for any float x: -inf -> 0, x > 88.72 -> +inf, subnormal results rounded once.
SPECDEC_INLINE float fast_exp(float x) {
  const float hi = 88.72283935546875f, lo = -104.0f;
  float xc = select(x > hi, hi, x);  // NaN stays NaN, as with the ternaries above
  xc = select(xc < lo, lo, xc);
  float n;
  const float y = exp_mantissa(xc, n);
  float out = times_pow2(y, n);
  out = select(x > hi, std::numeric_limits<float>::infinity(), out);
  return select(x < lo, 0.0f, out);
}

// log(x): 0 -> -inf, x < 0 or NaN -> NaN, +inf -> +inf, subnormal inputs handled.
SPECDEC_INLINE float fast_log(float x) {
  const bool subnormal = x < 1.17549435e-38f;
  const float xs = x * select(subnormal, 8388608.0f, 1.0f);  // * 2^23
  int32_t e;
  const float m = log_split(xs, subnormal, e);
  const bool small = m < 0.707106781186547524f;
  e = small ? e - 1 : e;
  const float f = m * select(small, 2.0f, 1.0f) - 1.0f;  // exact (Sterbenz)
  return log_specials(x, log_polynomial(f, e));
}
#endif  // __AVX512F__

SPECDEC_INLINE float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float, exact for every input (normals, subnormals, inf, NaN), branch-free.
SPECDEC_INLINE float fp16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
#if defined(__AVX512F__)
  const uint32_t magnitude = two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized);
#else
  // AVX2: the ternary of two computed floats became a branch, and every loop reading float16
  // logits stayed scalar ("control flow in loop"); an integer-mask select keeps it vectorised.
  const uint32_t magnitude = float_to_bits(select(two_w < (1u << 27), denormalized, normalized));
#endif
  return bits_to_float(sign | magnitude);
}

// Reading one logit as float32, for each supported storage type.
struct LoadF32 {
  using raw = float;
  SPECDEC_INLINE static float load(raw v) { return v; }
};
struct LoadBF16 {
  using raw = uint16_t;
  SPECDEC_INLINE static float load(raw v) { return bf16_to_float(v); }
};
struct LoadF16 {
  using raw = uint16_t;
  SPECDEC_INLINE static float load(raw v) { return fp16_to_float(v); }
};

// Lane-parallel reductions: kLanes independent accumulators, so GCC vectorises them without
// -ffast-math, and the summation order is fixed (same result on AVX2 and AVX-512 machines).
constexpr int kLanes = 16;

inline float lanes_sum(const float* acc) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

inline float lanes_max(const float* acc) {
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace specdec
