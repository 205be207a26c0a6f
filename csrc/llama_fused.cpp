// Fused elementwise ops of a Llama decoder layer on CPU, float32 (spec: kernels/llama_ops/reference.py):
//
//   rms_norm(x [T, H], weight [H], eps) -> weight * (x * rsqrt(mean(x^2) + eps))      [T, H]
//   rope_qk_(q [T, Hq, D], k [T, Hk, D], cos [T, R], sin [T, R]) -> ()   in place, R <= D:
//       x[:R] = x[:R] * cos + rotate_half(x[:R]) * sin,  rotate_half(y) = cat(-y[R/2:], y[:R/2])
//       (R < D: a partial rotary embedding, x[R:] as it is)
//   silu_mul(gate [T, F], up [T, F]) -> gate / (1 + exp(-gate)) * up                   [T, F]
//   rope_cos_sin(positions [T], inv_freq [D/2], scaling) -> (cos, sin) [T, D]
//
// Why: a draft step of the demo pair (2 layers, hidden 128) spent most of its time in the
// dispatch of ~120 small torch ops (1-5 us each, torch.profiler); each op here replaces 3 to 7.
// rope_qk_ does the same float ops in the same order as the torch expression (bit-identical
// without FMA contraction); rms_norm's sum of squares and silu's exp differ from torch's in
// the last bits only. Rows are independent: one thread (these ops take microseconds).
#include "aten_lean.h"
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "vec_math.h"

namespace specdec {
namespace fused {
namespace {

void check_f32_cpu(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims, name, " must have ", dims, " dims, got ", t.sizes());
  TORCH_CHECK(t.size(dims - 1) <= 1 || t.stride(dims - 1) == 1, name, " needs a unit stride in its last dim, got strides ",
              t.strides());
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_f32_cpu(x, "x", 2);
  check_f32_cpu(weight, "weight", 1);
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.size(0) == H, "weight must be [", H, "] (x's last dim), got ", weight.sizes());
  at::Tensor y = at::empty({T, H}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  const float epsf = static_cast<float>(eps);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = xp + t * ldx;
    float acc[kLanes] = {};
    int64_t h = 0;
    for (; h + kLanes <= H; h += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += row[h + l] * row[h + l];
    float ss = lanes_sum(acc);
    for (; h < H; ++h) ss += row[h] * row[h];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + epsf);
    float* out = yp + t * H;
    for (int64_t i = 0; i < H; ++i) out[i] = w[i] * (row[i] * r);
  }
  return y;
}

// The first R dims of each head rotated (R = cos's width: R < D for a partial rotary embedding,
// whose other dims pass as they are), element i paired with i + R / 2.
void rope_rows(const at::Tensor& x, const float* cos, const float* sin, int64_t R) {
  const int64_t T = x.size(0), heads = x.size(1), half = R / 2;
  float* base = x.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + t * R;
    const float* s = sin + t * R;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = base + t * x.stride(0) + h * x.stride(1);
      float out[512];
      for (int64_t d = 0; d < half; ++d) out[d] = v[d] * c[d] + (-v[d + half]) * s[d];
      for (int64_t d = half; d < R; ++d) out[d] = v[d] * c[d] + v[d - half] * s[d];
      for (int64_t d = 0; d < R; ++d) v[d] = out[d];
    }
  }
}

void rope_qk_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  check_f32_cpu(q, "q", 3);
  check_f32_cpu(k, "k", 3);
  check_f32_cpu(cos, "cos", 2);
  check_f32_cpu(sin, "sin", 2);
  const int64_t T = q.size(0), D = q.size(2);
  TORCH_CHECK(k.size(0) == T && k.size(2) == D, "k must be [", T, ", Hk, ", D, "] like q, got ", k.sizes());
  TORCH_CHECK(D % 2 == 0 && D <= 512, "head_dim must be even and <= 512, got ", D);
  const int64_t R = cos.size(1);  // the rotated dims: D, or fewer (a partial rotary embedding)
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == T && R <= D && R % 2 == 0, "cos and sin must be [", T,
              ", R] with R even and <= ", D, ", got ", cos.sizes(), " and ", sin.sizes());
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos and sin must be contiguous");
  rope_rows(q, cos.data_ptr<float>(), sin.data_ptr<float>(), R);
  rope_rows(k, cos.data_ptr<float>(), sin.data_ptr<float>(), R);
}

// cos, sin [T, D] of positions [T] (int32/int64) and inv_freq [D/2]: angle = float(pos) * inv_freq[i]
// in float32 (transformers' math), duplicated to both halves, cos/sin evaluated in double and
// rounded once (torch's float cos/sin may differ in the last bit), times scaling.
std::vector<at::Tensor> rope_cos_sin_cpu(const at::Tensor& positions, const at::Tensor& inv_freq, double scaling) {
  TORCH_CHECK(positions.device().is_cpu() && positions.dim() == 1 &&
                  (positions.scalar_type() == at::kInt || positions.scalar_type() == at::kLong),
              "positions must be a 1-D int32/int64 CPU tensor, got ", positions.scalar_type(), " ", positions.sizes());
  check_f32_cpu(inv_freq, "inv_freq", 1);
  const int64_t T = positions.size(0), half = inv_freq.size(0), D = 2 * half;
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const float* f = inv_freq.data_ptr<float>();
  at::Tensor cos = at::empty({T, D}, inv_freq.options()), sin = at::empty({T, D}, inv_freq.options());
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  const float sc = static_cast<float>(scaling);
  for (int64_t t = 0; t < T; ++t) {
    const float p = static_cast<float>(pp[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = p * f[i * inv_freq.stride(0)];
      const float cv = static_cast<float>(std::cos(static_cast<double>(angle))) * sc;
      const float sv = static_cast<float>(std::sin(static_cast<double>(angle))) * sc;
      c[t * D + i] = c[t * D + half + i] = cv;
      s[t * D + i] = s[t * D + half + i] = sv;
    }
  }
  return {cos, sin};
}

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  check_f32_cpu(gate, "gate", 2);
  check_f32_cpu(up, "up", 2);
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have one shape, got ", gate.sizes(), " and ", up.sizes());
  const int64_t T = gate.size(0), F = gate.size(1);
  at::Tensor y = at::empty({T, F}, gate.options());
  float* yp = y.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate.data_ptr<float>() + t * gate.stride(0);
    const float* u = up.data_ptr<float>() + t * up.stride(0);
    float* out = yp + t * F;
    for (int64_t i = 0; i < F; ++i) out[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
  }
  return y;
}

}  // namespace
}  // namespace fused
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rope_qk_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("rope_cos_sin(Tensor positions, Tensor inv_freq, float scaling) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("rms_norm", &specdec::fused::rms_norm_cpu);
  m.impl("rope_qk_", &specdec::fused::rope_qk_cpu);
  m.impl("silu_mul", &specdec::fused::silu_mul_cpu);
  m.impl("rope_cos_sin", &specdec::fused::rope_cos_sin_cpu);
}
