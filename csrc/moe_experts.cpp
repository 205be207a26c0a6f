// moe_pairs on CPU (spec: kernels/moe/reference.py): each (token, expert) pair's product with its
// expert's weight, then the experts' activation, for the MoE MLPs of runners/_moe.py.
//
//   moe_experts(x [T, K], experts [P] int64, weight [E, R, K], pairs_per_token, scale [P]?, act,
//               bias [E, R]?, alpha, limit) -> [P, R] (act 0, 3) or [P, R / 2]
//   act 0: none; 1: SwiGLU (gate rows, then up rows): silu(gate) * up; 2: GPT-OSS (gate / up
//   interleaved): g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha g);
//   3: relu2 (ungated, Nemotron-H's experts): max(y, 0)^2
//
// The pairs are grouped by expert here, on the host (CPU tensors: reading them is no device
// sync, and one op is what the engine's static graph twin sees), and each chosen expert's weight
// is applied ONCE to the rows of the pairs that chose it (one matrix product, torch's BLAS),
// in place: no copy of any weight. What it replaced on CPU: for few pairs the chosen experts'
// weights copied per pair (index_select) and applied as batched products; for more, every expert
// over every token. Measured (bench/bench_moe.py --cpu, bench/results/moe_cpu.json).
// Products in x's dtype (float32 exact; bf16 / fp16 rounded once per product, as F.linear and
// transformers' experts round), then bias, activation and scale in float32, rounded once.
#include "aten_lean.h"
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace specdec {
namespace moe {
namespace {

constexpr int64_t kNone = 0, kSwiglu = 1, kGptOss = 2, kRelu2 = 3;

void check(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weight, int64_t pairs_per_token,
           const c10::optional<at::Tensor>& scale, int64_t act, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && experts.device().is_cpu() && weight.device().is_cpu(),
              "moe_experts takes CPU tensors");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 3 && experts.dim() == 1, "x [T, K], experts [P], weight [E, R, K]");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "x and weight must share a dtype");
  TORCH_CHECK(experts.scalar_type() == at::kLong, "experts must be int64");
  TORCH_CHECK(weight.size(2) == x.size(1), "weight's K must be x's width");
  TORCH_CHECK(pairs_per_token >= 1 && experts.size(0) == x.size(0) * pairs_per_token,
              "experts must hold tokens x pairs_per_token entries");
  TORCH_CHECK(act >= kNone && act <= kRelu2, "act must be 0 (none), 1 (SwiGLU), 2 (GPT-OSS) or 3 (relu2)");
  TORCH_CHECK(act == kNone || act == kRelu2 || weight.size(1) % 2 == 0, "a gated weight has an even row count");
  if (scale.has_value()) {
    TORCH_CHECK(scale->dim() == 1 && scale->size(0) == experts.size(0) && scale->device().is_cpu(), "scale must be [P]");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 2 && bias->size(0) == weight.size(0) && bias->size(1) == weight.size(1) &&
                    bias->device().is_cpu(),
                "bias must be [E, R]");
  }
}

// One expert's float32 products y [n, R] (bias added) -> the activation into rows `pairs` of out.
template <typename out_t>
void finish(const float* y, int64_t n, int64_t rows, const int64_t* pairs, const float* scale, int64_t act,
            double alpha, double limit, out_t* out, int64_t width) {
  const float a = static_cast<float>(alpha), lim = static_cast<float>(limit);
  for (int64_t i = 0; i < n; ++i) {
    const float* yi = y + i * rows;
    out_t* o = out + pairs[i] * width;
    const float s = scale == nullptr ? 1.0f : scale[pairs[i]];
    for (int64_t j = 0; j < width; ++j) {
      float v;
      if (act == kSwiglu) {
        const float g = yi[j], u = yi[width + j];
        v = g / (1.0f + std::exp(-g)) * u;
      } else if (act == kGptOss) {
        const float g = std::min(yi[2 * j], lim), u = std::min(std::max(yi[2 * j + 1], -lim), lim);
        v = (u + 1.0f) * (g / (1.0f + std::exp(-a * g)));
      } else if (act == kRelu2) {
        const float r = std::max(yi[j], 0.0f);
        v = r * r;
      } else {
        v = yi[j];
      }
      o[j] = static_cast<out_t>(v * s);
    }
  }
}

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weight, int64_t pairs_per_token,
                       const c10::optional<at::Tensor>& scale, int64_t act, const c10::optional<at::Tensor>& bias,
                       double alpha, double limit) {
  check(x, experts, weight, pairs_per_token, scale, act, bias);
  const int64_t P = experts.size(0), E = weight.size(0), R = weight.size(1);
  const int64_t width = act == kNone || act == kRelu2 ? R : R / 2;
  at::Tensor out = at::empty({P, width}, x.options());
  if (P == 0 || width == 0) return out;
  const at::Tensor ids = experts.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> chose(E);  // expert -> its pairs, in pair order
  for (int64_t p = 0; p < P; ++p) {
    TORCH_CHECK(id[p] >= 0 && id[p] < E, "expert id ", id[p], " of pair ", p, " is outside [0, ", E, ")");
    chose[id[p]].push_back(p);
  }
  const at::Tensor scale32 = scale.has_value() ? scale->to(at::kFloat).contiguous() : at::Tensor();
  const float* sp = scale.has_value() ? scale32.data_ptr<float>() : nullptr;
  const at::Tensor bias32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& pairs = chose[e];
    const int64_t n = static_cast<int64_t>(pairs.size());
    if (n == 0) continue;
    at::Tensor tokens = at::empty({n}, ids.options());
    int64_t* tp = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) tp[i] = pairs[i] / pairs_per_token;
    // [n, K] x [K, R]: the expert's weight read in place (a transposed view: BLAS takes either layout)
    at::Tensor y = x.index_select(0, tokens).mm(weight.select(0, e).t()).to(at::kFloat);
    if (bias.has_value()) y.add_(bias32.select(0, e));
    y = y.contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "moe_experts", [&] {
      finish<scalar_t>(y.data_ptr<float>(), n, R, pairs.data(), sp, act, alpha, limit, out.data_ptr<scalar_t>(),
                       width);
    });
  }
  return out;
}

}  // namespace
}  // namespace moe
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "moe_experts(Tensor x, Tensor experts, Tensor weight, int pairs_per_token, Tensor? scale, int act, Tensor? bias, "
      "float alpha, float limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) { m.impl("moe_experts", &specdec::moe::moe_experts); }
