// Paged attention for N new queries per row on CPU: torch.ops.specdec_fast.paged_attention.
//
// Same semantics as kernels/attention/reference.py. One task per (row b, KV head): its n*G
// query rows (n new queries x G heads of the GQA group) walk the row's pages once, so each
// K/V page is converted to fp32 once and reused by every query row that reads it (scoring
// K+1 positions costs about one decode step of memory traffic). Online softmax per page
// (one rescale per page, not per key), fp32 math, SIMD dot products and axpys over head_dim.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace specdec {
namespace attention {
namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void scale_add(float* acc, float alpha, const float* x, float p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] * alpha + p * x[i];
}

template <typename scalar_t>
inline void to_float(float* dst, const scalar_t* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_table,
         const at::Tensor& seq_lens, const at::Tensor& cu_query_lens, const c10::optional<at::Tensor>& tree_mask,
         double scale, at::Tensor& out) {
  const int64_t B = block_table.size(0), max_blocks = block_table.size(1);
  const int64_t Hq = q.size(1), D = q.size(2);
  const int64_t page = k_cache.size(1), Hkv = k_cache.size(2), G = Hq / Hkv;
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k_cache.data_ptr<scalar_t>();
  const scalar_t* vp = v_cache.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_query_lens.data_ptr<int32_t>();
  const int64_t* tree = tree_mask.has_value() ? tree_mask->data_ptr<int64_t>() : nullptr;
  const int64_t ks0 = k_cache.stride(0), ks1 = k_cache.stride(1), ks2 = k_cache.stride(2);
  const int64_t vs0 = v_cache.stride(0), vs1 = v_cache.stride(1), vs2 = v_cache.stride(2);
  const int64_t bts = block_table.stride(0);
  const float sc = static_cast<float>(scale);
  const float neg_inf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    std::vector<float> qbuf, acc, m, l, kbuf(page * D), vbuf(page * D), s(page);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t q0 = cu[b], n = cu[b + 1] - cu[b], L = lens[b], prefix = L - n;
        if (n <= 0) continue;
        const int64_t R = n * G;  // rows: r = i * G + g -> query i, head h * G + g
        qbuf.assign(R * D, 0.f);
        acc.assign(R * D, 0.f);
        m.assign(R, neg_inf);
        l.assign(R, 0.f);
        for (int64_t r = 0; r < R; ++r) {
          const scalar_t* src = qp + ((q0 + r / G) * Hq + h * G + r % G) * D;
          float* dst = &qbuf[r * D];
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * sc;
        }
        const int64_t pages = std::min<int64_t>((L + page - 1) / page, max_blocks);
        for (int64_t pg = 0; pg < pages; ++pg) {
          const int64_t j0 = pg * page, j1 = std::min<int64_t>(j0 + page, L), cnt = j1 - j0;
          const int64_t phys = bt[b * bts + pg];
          for (int64_t j = 0; j < cnt; ++j) {
            to_float(&kbuf[j * D], kp + phys * ks0 + j * ks1 + h * ks2, D);
            to_float(&vbuf[j * D], vp + phys * vs0 + j * vs1 + h * vs2, D);
          }
          for (int64_t r = 0; r < R; ++r) {
            const int64_t i = r / G;
            const int64_t end = std::min<int64_t>(cnt, prefix + i + 1 - j0);  // causal
            if (end <= 0) continue;
            const int64_t bits = tree ? tree[q0 + i] : 0;
            float cmax = neg_inf;
            for (int64_t j = 0; j < end; ++j) {
              const int64_t jn = j0 + j - prefix;  // index among the new tokens
              const bool visible = !tree || jn < 0 || ((bits >> jn) & 1);
              s[j] = visible ? dot(&qbuf[r * D], &kbuf[j * D], D) : neg_inf;
              cmax = std::max(cmax, s[j]);
            }
            if (cmax == neg_inf) continue;
            const float m_new = std::max(m[r], cmax);
            const float alpha = std::exp(m[r] - m_new);  // m = -inf -> 0
            float* a = &acc[r * D];
            float lsum = l[r] * alpha;
            bool first = true;
            for (int64_t j = 0; j < end; ++j) {
              if (s[j] == neg_inf) continue;
              const float p = std::exp(s[j] - m_new);
              lsum += p;
              scale_add(a, first ? alpha : 1.f, &vbuf[j * D], p, D);
              first = false;
            }
            m[r] = m_new;
            l[r] = lsum;
          }
        }
        for (int64_t r = 0; r < R; ++r) {
          scalar_t* dst = op + ((q0 + r / G) * Hq + h * G + r % G) * D;
          const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(acc[r * D + d] * inv);
        }
      }
    }
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& cu_query_lens,
                           const c10::optional<at::Tensor>& tree_mask, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "paged_attention: q must be a contiguous [T, Hq, D] tensor");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_attention: k_cache/v_cache shape");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "paged_attention: caches need stride(-1) == 1");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "paged_attention: cache dtype must match q");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0, "paged_attention: head shapes");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.stride(1) == 1,
              "paged_attention: block_table must be int32 [B, max_blocks] with stride(1) == 1");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() && seq_lens.size(0) == block_table.size(0),
              "paged_attention: seq_lens must be contiguous int32 [B]");
  TORCH_CHECK(cu_query_lens.scalar_type() == at::kInt && cu_query_lens.is_contiguous() &&
                  cu_query_lens.size(0) == block_table.size(0) + 1,
              "paged_attention: cu_query_lens must be contiguous int32 [B+1]");
  if (tree_mask.has_value())
    TORCH_CHECK(tree_mask->scalar_type() == at::kLong && tree_mask->is_contiguous() && tree_mask->size(0) == q.size(0),
                "paged_attention: tree_mask must be contiguous int64 [T]");
  at::Tensor out = at::zeros_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_attention", [&] {
    run<scalar_t>(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale, out);
  });
  return out;
}

}  // namespace
}  // namespace attention
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor cu_query_lens, Tensor? tree_mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) { m.impl("paged_attention", &specdec::attention::paged_attention); }
