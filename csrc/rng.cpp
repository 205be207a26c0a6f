// Test hooks for csrc/philox.h and csrc/vec_math.h: the C++ random stream and float helpers
// exposed as ops, so tests/kernels/test_rng_cpp.py can compare them with kernels/rng.
//
//   philox_draws(seed, offset, position, vocab_index: int64 [N], stream) -> (bits int64, uniform,
//                uniform_open, gumbel: float32 [N])
//   fast_exp_log(x: float32 [N]) -> (exp(x), log(x))
#include <ATen/ATen.h>
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
    const uint32_t x = philox_bits(philox_key(s[i], o[i], p[i], static_cast<int>(stream)), static_cast<uint32_t>(v[i]));
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

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def("philox_draws(Tensor seed, Tensor offset, Tensor position, Tensor vocab_index, int stream) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("fast_exp_log(Tensor x) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("philox_draws", &specdec::philox_draws);
  m.impl("fast_exp_log", &specdec::fast_exp_log);
}
