// Test hooks for csrc/philox.h and csrc/vec_math.h: the C++ random stream and float helpers
// exposed as ops, so tests/kernels/test_rng_cpp.py can compare them with kernels/rng.
//
//   philox_draws(seed, offset, position, vocab_index: int64 [N], stream) -> (bits int64, uniform,
//                uniform_open, gumbel: float32 [N])
//   fast_exp_log(x: float32 [N]) -> (exp(x), log(x))
//   gumbel_noise(key: int64 [3] = (seed, offset, position), stream, v0, n) -> float32 [n]: gumbel_block's
//                noise of vocab indices v0 .. v0 + n - 1 (one Philox call per four indices, the kernels' loop)
#include "aten_lean.h"
#include <torch/library.h>

#include "philox.h"
#include "vec_math.h"

namespace specdec {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> philox_draws(const at::Tensor& seed, const at::Tensor& offset,
                                                                        const at::Tensor& position, const at::Tensor& vocab_index,
                                                                        int64_t stream) {
  const int64_t n = seed.numel();
  for (const at::Tensor* t : {&seed, &offset, &position, &vocab_index}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 && t->numel() == n && t->is_contiguous(),
                "philox_draws takes contiguous CPU int64 tensors [N] of equal length");
  }
  TORCH_CHECK(stream >= 0 && stream < 256, "stream must lie in [0, 256)");
  at::Tensor bits = at::empty({n}, seed.options());
  at::Tensor u = at::empty({n}, seed.options().dtype(at::kFloat)), uo = at::empty_like(u), g = at::empty_like(u);
  const int64_t *s = seed.data_ptr<int64_t>(), *o = offset.data_ptr<int64_t>(), *p = position.data_ptr<int64_t>(),
                *v = vocab_index.data_ptr<int64_t>();
  int64_t* out = bits.data_ptr<int64_t>();
  float *pu = u.data_ptr<float>(), *puo = uo.data_ptr<float>(), *pg = g.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = philox_bits(philox_key(s[i], o[i], p[i], static_cast<int>(stream)), static_cast<uint64_t>(v[i]));
    out[i] = x;
    pu[i] = uniform_from_bits(x);
    puo[i] = uniform_open_from_bits(x);
    pg[i] = gumbel_from_bits(x);
  }
  return {bits, u, uo, g};
}

std::tuple<at::Tensor, at::Tensor> fast_exp_log(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous CPU float32");
  at::Tensor e = at::empty_like(x), l = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float *pe = e.data_ptr<float>(), *pl = l.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    pe[i] = fast_exp(px[i]);
    pl[i] = fast_log(px[i]);
  }
  return {e, l};
}

at::Tensor gumbel_noise(const at::Tensor& key, int64_t stream, int64_t v0, int64_t n) {
  TORCH_CHECK(key.device().is_cpu() && key.scalar_type() == at::kLong && key.numel() == 3 && key.is_contiguous(),
              "key must be a contiguous CPU int64 tensor [3]: seed, offset, position");
  TORCH_CHECK(stream >= 0 && stream < 256, "stream must lie in [0, 256)");
  TORCH_CHECK(v0 >= 0 && n >= 0 && v0 + n <= (int64_t(1) << 32), "vocab indices must lie in [0, 2**32)");
  const int64_t* k = key.data_ptr<int64_t>();
  at::Tensor g = at::empty({n}, key.options().dtype(at::kFloat));
  gumbel_block(philox_key(k[0], k[1], k[2], static_cast<int>(stream)), v0, n, g.data_ptr<float>());
  return g;
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def("philox_draws(Tensor seed, Tensor offset, Tensor position, Tensor vocab_index, int stream) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("fast_exp_log(Tensor x) -> (Tensor, Tensor)");
  m.def("gumbel_noise(Tensor key, int stream, int v0, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("philox_draws", &specdec::philox_draws);
  m.impl("fast_exp_log", &specdec::fast_exp_log);
  m.impl("gumbel_noise", &specdec::gumbel_noise);
}
