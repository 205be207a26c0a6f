// Argument handling shared by the verify-family ops (verify.cpp, tree_verify.cpp): per-row
// sampling parameters, logits checks, the OpenMP team size and the logits dtype dispatch.
#pragma once

#include "aten_lean.h"

#include "standardise.h"

namespace specdec {

struct Params {
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;
  SamplingRow row(int64_t b) const { return {temperature[b], top_k[b], top_p[b], min_p[b]}; }
};

inline Params check_params(int64_t batch, const at::Tensor& temperature, const at::Tensor& top_k,
                           const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& seed, const at::Tensor& offset) {
  auto check = [batch](const at::Tensor& t, at::ScalarType dtype, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == batch && t.is_contiguous(),
                name, " must be a contiguous CPU ", c10::toString(dtype), " tensor [", batch, "], got ", t.scalar_type(), " ",
                t.sizes());
  };
  check(temperature, at::kFloat, "temperature");
  check(top_k, at::kInt, "top_k");
  check(top_p, at::kFloat, "top_p");
  check(min_p, at::kFloat, "min_p");
  check(seed, at::kLong, "seed");
  check(offset, at::kLong, "offset");
  return {temperature.data_ptr<float>(), top_k.data_ptr<int32_t>(), top_p.data_ptr<float>(), min_p.data_ptr<float>(),
          seed.data_ptr<int64_t>(), offset.data_ptr<int64_t>()};
}

// The penalty tensors of a call (penalties.h): all four given, or none (counts == nullptr: off).
struct Penalties {
  const int32_t* counts = nullptr;  // [B, V] state words
  const float* repetition = nullptr;
  const float* frequency = nullptr;
  const float* presence = nullptr;
  int64_t vocab = 0;
  bool on() const { return counts != nullptr; }
  // Row b's penalties at a position with `ntok` generated tokens in front of it that the state lacks.
  RowPenalty row(int64_t b, const int64_t* tokens, int64_t ntok) const {
    return {counts + b * vocab, repetition[b], frequency[b], presence[b], tokens, ntok};
  }
};

inline Penalties check_penalties(int64_t batch, int64_t vocab, const c10::optional<at::Tensor>& counts,
                                 const c10::optional<at::Tensor>& repetition, const c10::optional<at::Tensor>& frequency,
                                 const c10::optional<at::Tensor>& presence) {
  const int given = counts.has_value() + repetition.has_value() + frequency.has_value() + presence.has_value();
  TORCH_CHECK(given == 0 || given == 4, "penalties: give penalty_counts, repetition, frequency and presence together");
  if (given == 0) return {};
  TORCH_CHECK(counts->device().is_cpu() && counts->scalar_type() == at::kInt && counts->is_contiguous() && counts->dim() == 2 &&
                  counts->size(0) == batch && counts->size(1) == vocab,
              "penalty_counts must be a contiguous CPU int32 tensor [B, V] = [", batch, ", ", vocab, "], got ",
              counts->scalar_type(), " ", counts->sizes());
  auto check = [batch](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == batch && t.is_contiguous(),
                name, " must be a contiguous CPU float32 tensor [", batch, "], got ", t.scalar_type(), " ", t.sizes());
  };
  check(*repetition, "repetition");
  check(*frequency, "frequency");
  check(*presence, "presence");
  return {counts->data_ptr<int32_t>(), repetition->data_ptr<float>(), frequency->data_ptr<float>(),
          presence->data_ptr<float>(), vocab};
}

inline void check_logits(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == dim && t.is_contiguous(), name, " must be a contiguous CPU tensor with ", dim,
              " dims, got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, name,
              " must be float32, bfloat16 or float16, got ", t.scalar_type());
}

// The OpenMP team follows torch.set_num_threads. On an oversubscribed machine (the shared
// 2-core dev box) libgomp's default spin-then-sleep wait made every parallel region cost a
// scheduler tick: B=8, K=4, V=32000 took 16 ms with 2 threads vs 4.3 ms with 1; with
// OMP_WAIT_POLICY=PASSIVE, 4.4 ms. Torch's own OpenMP ops show the same effect.
inline int num_threads() { return at::get_num_threads(); }

template <class F>
void dispatch_dtype(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) f(LoadF32{});
  else if (dtype == at::kBFloat16) f(LoadBF16{});
  else f(LoadF16{});
}

}  // namespace specdec
