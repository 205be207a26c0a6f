// y[M, N] = x[M, K] @ W^T (+ bias[N]) (+ residual[M, N]) for few rows M on CPU, float32:
// torch.ops.specdec_fast.skinny_linear (spec: kernels/linear/reference.py).
//
// Why: torch's sgemm packs the whole weight on every call once M > 1, while M = 1 takes a
// GEMV path, so scoring 5 tokens of the demo target cost 1.6x one token (measured, 1 thread).
// Here the weight is streamed once per call whatever M is: a tile of NB weight rows (or NV vectors
// of columns) is loaded into registers once and multiplied with MB rows of x, so up to MB x NB
// independent SIMD accumulator chains share each load (no packing, no copy).
//
// Weight layouts (no copy either way):
//  - "rows": W [N, K] with a unit stride along K (nn.Linear). Dot products along K in 16-lane
//    accumulators (one zmm, or two ymm halves), reduced at the end of the row (fixed lane order).
//  - "cols": W is the transposed view of a contiguous [K, N] tensor (GPT-2's Conv1D weight
//    .t()), unit stride along N. Each k step broadcasts x[m, k] over 16 (8 on AVX2) columns.
// Summation order is fixed by the code (no FMA contraction, -ffp-contract=off) and is the same
// on the AVX-512 and the AVX2 tiles, so results depend neither on the thread count nor on the
// machine's vector width (tests/kernels/test_skinny_linear.py checks it against a torch emulation
// of that order, bit for bit).
#include "aten_lean.h"
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "skinny_linear_args.h"
#include "vec_math.h"
// The tile kernels (kMaxMB, block_rows<MB>, block_cols<MB>, kTilesIsa) for the ISA this file is
// compiled for (-march=native): 16-float vectors for 32 zmm registers, or 8-float vectors for 16
// ymm registers (AVX2/FMA; also the portable path, lowered by GCC to what the machine has).
#if defined(__AVX512F__)
#include "skinny_linear_avx512.h"
#else
#include "skinny_linear_avx2.h"
#endif

namespace specdec {
namespace linear {
namespace {

// Work (multiply-adds) below which the op stays on the calling thread. Waking a second thread
// cost 10-20 ms on the loaded shared 2-core box (csrc/cache_ops.cpp); 1<<21 MACs take ~0.1 ms.
constexpr int64_t kParallelMacs = int64_t(1) << 21;

template <bool kRows>
void run_block(const Args& a, int64_t m0, int mb, int64_t n0, int64_t n1) {
  switch (mb) {
#define SPECDEC_CASE(MB)                                                 \
  case MB:                                                               \
    return kRows ? block_rows<MB>(a, m0, n0, n1) : block_cols<MB>(a, m0, n0, n1);
    SPECDEC_CASE(1)
    SPECDEC_CASE(2)
    SPECDEC_CASE(3)
    SPECDEC_CASE(4)
    SPECDEC_CASE(5)
    SPECDEC_CASE(6)
#undef SPECDEC_CASE
  }
}

// Output columns [n0, n1) for every row of x: the weight slice is streamed from memory once per
// block of 64 columns and re-read from L1/L2 for the further chunks of 8 rows.
template <bool kRows>
void run_columns(const Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t kBlockN = 64;
  for (int64_t nb = n0; nb < n1; nb += kBlockN) {
    const int64_t ne = std::min(n1, nb + kBlockN);
    const int64_t chunks = (a.M + kMaxMB - 1) / kMaxMB;
    for (int64_t c = 0, m0 = 0; c < chunks; ++c) {
      const int64_t mb = (a.M - m0) / (chunks - c);  // remaining rows over remaining chunks: <= kMaxMB
      run_block<kRows>(a, m0, static_cast<int>(mb), nb, ne);
      m0 += mb;
    }
  }
}

at::Tensor skinny_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                             const c10::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "skinny_linear (C++) runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "x and weight must be float32, got ",
              x.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [M, K] and weight [N, K], got ", x.sizes(), " and ", weight.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K, "weight [N, K] must have K = ", K, " (x's last dim), got ", weight.sizes());
  TORCH_CHECK(K <= 1 || x.stride(1) == 1, "x needs a unit stride in its last dim, got strides ", x.strides());
  const bool rows = K <= 1 || weight.stride(1) == 1;
  TORCH_CHECK(rows || N <= 1 || weight.stride(0) == 1,
              "weight must be [N, K] with a unit stride along K, or the transpose of a [K, N] tensor with a unit stride "
              "along N; got strides ", weight.strides());
  Args a{x.data_ptr<float>(), M > 1 ? x.stride(0) : K, weight.data_ptr<float>(), rows ? weight.stride(0) : weight.stride(1),
         nullptr, nullptr, 0, nullptr, M, N, K};
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    TORCH_CHECK(b.device().is_cpu() && b.scalar_type() == at::kFloat && b.dim() == 1 && b.size(0) == N && b.is_contiguous(),
                "bias must be a contiguous float32 CPU tensor [", N, "], got ", b.scalar_type(), " ", b.sizes());
    a.bias = b.data_ptr<float>();
  }
  if (residual.has_value()) {
    const at::Tensor& r = *residual;
    TORCH_CHECK(r.device().is_cpu() && r.scalar_type() == at::kFloat && r.dim() == 2 && r.size(0) == M && r.size(1) == N &&
                    (N <= 1 || r.stride(1) == 1),
                "residual must be a float32 CPU tensor [", M, ", ", N, "] with a unit stride in its last dim, got ",
                r.scalar_type(), " ", r.sizes());
    a.residual = r.data_ptr<float>();
    a.ldr = M > 1 ? r.stride(0) : N;
  }
  at::Tensor y = at::empty({M, N}, x.options());
  a.y = y.data_ptr<float>();
  if (M == 0 || N == 0) return y;
  // Parallel over 64-column blocks, only for work that pays for waking threads.
  const int64_t blocks = (N + 63) / 64;
  const int64_t grain = std::max<int64_t>(1, kParallelMacs / std::max<int64_t>(1, 64 * M * K));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 64, n1 = std::min(N, b1 * 64);
    if (rows)
      run_columns<true>(a, n0, n1);
    else
      run_columns<false>(a, n0, n1);
  });
  return y;
}

// Several products of one x (q/k/v, gate/up): one dispatch from Python instead of one per weight.
std::vector<at::Tensor> skinny_linear_n_cpu(const at::Tensor& x, at::TensorList weights,
                                            const c10::List<c10::optional<at::Tensor>>& biases) {
  TORCH_CHECK(biases.size() == weights.size(), "biases must have one entry (a tensor or None) per weight, got ",
              biases.size(), " for ", weights.size(), " weights");
  std::vector<at::Tensor> out;
  out.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out.push_back(skinny_linear_cpu(x, weights[i], biases.get(i), c10::nullopt));
  return out;
}

// The instruction set the tiles were compiled for: "avx512", "avx2" or "generic" (Python routes
// by it: kernels/linear/__init__.py).
std::string skinny_linear_isa() { return kTilesIsa; }

}  // namespace
}  // namespace linear
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor");
  m.def("skinny_linear_n(Tensor x, Tensor[] weights, Tensor?[] biases) -> Tensor[]");
  m.def("skinny_linear_isa() -> str", &specdec::linear::skinny_linear_isa);
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("skinny_linear", &specdec::linear::skinny_linear_cpu);
  m.impl("skinny_linear_n", &specdec::linear::skinny_linear_n_cpu);
}
