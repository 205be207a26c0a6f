// Paged attention for N new queries per row on CPU: torch.ops.specdec_fast.paged_attention.
//
// Same semantics as kernels/attention/reference.py. One task per (row b, KV head): its n*G
// query rows (n new queries x G heads of the GQA group) walk the row's keys once, in chunks
// of 16, so each K/V chunk is converted to fp32 once and reused by every query row (scoring
// K+1 positions costs about one decode step of memory traffic). Scores of 4 rows x 16 keys
// are computed together from a transposed K chunk (independent SIMD FMA chains; a plain
// per-key dot product was latency bound); online softmax per chunk, fp32 math throughout.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace specdec {
namespace attention {
namespace {

constexpr int64_t CHUNK = 16;  // keys per step: fixed trip counts let the compiler unroll + vectorise
constexpr int64_t ROWS = 4;    // query rows scored together: 4 independent FMA chains per key vector

template <typename scalar_t>
inline void to_float(float* dst, const scalar_t* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// s[k][j] = sum_d q[k][d] * key[j][d] for ROWS rows: four independent SIMD accumulator chains
// share each key load (a single per-row dot product was FMA-latency bound).
inline void score_rows(const float* q, int64_t D, const float* keys, int64_t cnt, float* s) {
  const float *q0 = q, *q1 = q + D, *q2 = q + 2 * D, *q3 = q + 3 * D;
  for (int64_t j = 0; j < cnt; ++j) {
    const float* k = keys + j * D;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t d = 0; d < D; ++d) {
      s0 += q0[d] * k[d];
      s1 += q1[d] * k[d];
      s2 += q2[d] * k[d];
      s3 += q3[d] * k[d];
    }
    s[j] = s0;
    s[CHUNK + j] = s1;
    s[2 * CHUNK + j] = s2;
    s[3 * CHUNK + j] = s3;
  }
}

// acc[k][d] += sum_j p[k][j] * v[j][d] for ROWS rows: each value vector is loaded once.
inline void accumulate_rows(float* acc, int64_t D, const float* p, const float* vals, int64_t cnt) {
  float *a0 = acc, *a1 = acc + D, *a2 = acc + 2 * D, *a3 = acc + 3 * D;
  for (int64_t j = 0; j < cnt; ++j) {
    const float p0 = p[j], p1 = p[CHUNK + j], p2 = p[2 * CHUNK + j], p3 = p[3 * CHUNK + j];
    if (p0 == 0.f && p1 == 0.f && p2 == 0.f && p3 == 0.f) continue;
    const float* v = vals + j * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      a0[d] += p0 * v[d];
      a1[d] += p1 * v[d];
      a2[d] += p2 * v[d];
      a3[d] += p3 * v[d];
    }
  }
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_table,
         const at::Tensor& seq_lens, const at::Tensor& cu_query_lens, const c10::optional<at::Tensor>& tree_mask,
         double scale, bool causal, at::Tensor& out) {
  const int64_t B = block_table.size(0);
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
    std::vector<float> qbuf, acc, m, l, kbuf(CHUNK * D), vbuf(CHUNK * D);
    std::vector<float> scores;  // [R padded to ROWS][CHUNK]
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t q0 = cu[b], n = cu[b + 1] - cu[b], L = lens[b], prefix = L - n;
        if (n <= 0) continue;
        const int64_t R = n * G;  // rows: r = i * G + g -> query i, head h * G + g
        const int64_t Rp = (R + ROWS - 1) / ROWS * ROWS;
        qbuf.assign(Rp * D, 0.f);
        acc.assign(Rp * D, 0.f);
        m.assign(Rp, neg_inf);
        l.assign(Rp, 0.f);
        scores.resize(Rp * CHUNK);
        for (int64_t r = 0; r < R; ++r) {
          const scalar_t* src = qp + ((q0 + r / G) * Hq + h * G + r % G) * D;
          float* dst = &qbuf[r * D];
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * sc;
        }
        for (int64_t j0 = 0; j0 < L; j0 += CHUNK) {
          const int64_t cnt = std::min<int64_t>(CHUNK, L - j0);
          // gather the chunk's keys and values as fp32
          for (int64_t j = 0; j < cnt; ++j) {
            const int64_t pos = j0 + j, phys = bt[b * bts + pos / page], slot = pos % page;
            to_float(&kbuf[j * D], kp + phys * ks0 + slot * ks1 + h * ks2, D);
            to_float(&vbuf[j * D], vp + phys * vs0 + slot * vs1 + h * vs2, D);
          }
          // rows whose causal window reaches this chunk: i >= j0 - prefix (every row: the block mask)
          const int64_t first_row = causal ? std::max<int64_t>(0, j0 - prefix) * G : 0;
          const int64_t first_quad = first_row / ROWS * ROWS;
          for (int64_t r = first_quad; r < R; r += ROWS)
            score_rows(&qbuf[r * D], D, kbuf.data(), cnt, &scores[r * CHUNK]);
          // online softmax: scores -> p (0 where masked), rescale acc and l
          for (int64_t r = first_quad; r < Rp; ++r) {
            float* s = &scores[r * CHUNK];
            const int64_t i = r / G;
            const int64_t end = r < first_row || r >= R ? 0 : causal ? std::min<int64_t>(cnt, prefix + i + 1 - j0) : cnt;
            const int64_t bits = tree && r < R ? tree[q0 + i] : 0;
            float cmax = neg_inf;
            for (int64_t j = 0; j < cnt; ++j) {
              const int64_t jn = j0 + j - prefix;  // index among the new tokens
              const bool visible = j < end && (!tree || jn < 0 || ((bits >> jn) & 1));
              s[j] = visible ? s[j] : neg_inf;
              cmax = std::max(cmax, s[j]);
            }
            if (cmax == neg_inf) {
              for (int64_t j = 0; j < cnt; ++j) s[j] = 0.f;
              continue;
            }
            const float m_new = std::max(m[r], cmax);
            const float alpha = std::exp(m[r] - m_new);  // m = -inf -> 0
            float lsum = 0.f;
            for (int64_t j = 0; j < cnt; ++j) {
              s[j] = s[j] == neg_inf ? 0.f : std::exp(s[j] - m_new);
              lsum += s[j];
            }
            if (alpha != 1.f) {
              float* a = &acc[r * D];
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
            }
            m[r] = m_new;
            l[r] = l[r] * alpha + lsum;
          }
          for (int64_t r = first_quad; r < R; r += ROWS)
            accumulate_rows(&acc[r * D], D, &scores[r * CHUNK], vbuf.data(), cnt);
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
                           const c10::optional<at::Tensor>& tree_mask, double scale, bool causal) {
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
    run<scalar_t>(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, tree_mask, scale, causal, out);
  });
  return out;
}

}  // namespace
}  // namespace attention
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor cu_query_lens, Tensor? tree_mask, float scale, bool causal=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) { m.impl("paged_attention", &specdec::attention::paged_attention); }
