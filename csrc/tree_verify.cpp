// C++ CPU backend of tree_verify (kernels/tree_verify/reference.py is the spec).
//
//   tree_verify(target [B,N,V], draft [B,N,V]?, tokens [B,N], parents [B,N], params...)
//       -> (tokens int32 [B,N], path int32 [B,N], num_accepted int32 [B])
//
// Two phases, OpenMP loops over independent work items:
//  1. per row: the walk down the tree. RowStats of a node's target (and draft) row are computed
//     when the walk first needs them, so nodes off the walk are never standardised; a residual
//     mass W (one pass over the vocab) only when a later sibling is tested after a rejection.
//  2. (row, vocab chunk) items: Gumbel-max of the emitted token at the final node (residual or
//     bonus); chunks merge in order (ties: lowest index), as in verify.cpp.
#include "aten_lean.h"
#include <torch/library.h>

#include <omp.h>

#include <algorithm>
#include <vector>

#include "philox.h"
#include "standardise.h"
#include "token_pass.h"
#include "verify_args.h"

namespace specdec {
namespace tree {
namespace {

constexpr int64_t kChunk = 16 * kBlock;  // vocab tokens per phase-2 work item

// Standardised probabilities of tokens [v0, v0 + n) of a row (n <= kBlock); out padded with 0.
template <class L>
SPECDEC_INLINE void block_probs(const typename L::raw* row, const RowStats& st, int64_t v0, int64_t n, float* out) {
  if (st.greedy >= 0) {
    for (int64_t i = 0; i < kBlock; ++i) out[i] = v0 + i == st.greedy ? 1.0f : 0.0f;
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = L::load(row[v0 + i]) / st.divisor;
  for (int64_t i = n; i < kBlock; ++i) out[i] = kNegInf;
  const float m = st.max, iz = st.inv_z;
  for (int64_t i = 0; i < kBlock; ++i) {
    const float y = out[i], e = fast_exp(y - m);
    out[i] = select(st.kept(y, e), e * iz, 0.0f);
  }
}

// W = sum_v max(q(v) - lam * p(v), 0): the mass of the residual after a rejection (fp32 lanes).
template <class L>
float residual_mass(const typename L::raw* qrow, const RowStats& qs, const typename L::raw* prow, const RowStats& ps,
                    float lam, int64_t vocab) {
  alignas(64) float q[kBlock], p[kBlock];
  float acc[kLanes] = {};
  for (int64_t b0 = 0; b0 < vocab; b0 += kBlock) {
    const int64_t n = std::min(kBlock, vocab - b0);
    block_probs<L>(qrow, qs, b0, n, q);
    block_probs<L>(prow, ps, b0, n, p);
    for (int64_t i = 0; i < kBlock; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float d = q[i + l] - lam * p[i + l];
        acc[l] += select(d > 0.0f, d, 0.0f);
      }
  }
  return lanes_sum(acc);
}

// Where the walk of one row ended: the final node, its depth, the residual's lam (0: no
// child of the final node was rejected) and the tokens a deterministic residual removes.
struct Walk {
  int64_t final_node = 0, depth = 0;
  float lam = 0.0f;
  std::vector<int64_t> removed;
};

template <class L>
struct Row {
  using raw = typename L::raw;
  const raw *target, *draft;  // this row's [N, V] logits (draft: nullptr = deterministic children)
  const int64_t *tok, *par;
  int64_t n, vocab;
  SamplingRow sp;
  std::vector<char> present;
  std::vector<RowStats> tstats, dstats;
  std::vector<char> have_t, have_d;

  Row(const raw* t, const raw* d, const int64_t* tk, const int64_t* pr, int64_t n_, int64_t v, SamplingRow s)
      : target(t), draft(d), tok(tk), par(pr), n(n_), vocab(v), sp(s), present(n_, 0), tstats(n_), dstats(n_),
        have_t(n_, 0), have_d(n_, 0) {
    present[0] = 1;
    for (int64_t i = 1; i < n; ++i) {
      const int64_t p = par[i];
      present[i] = p >= 0 && p < i && present[p];
      TORCH_CHECK(!present[i] || (tok[i] >= 0 && tok[i] < vocab), "tokens must lie in [0, V) at present nodes, got ", tok[i]);
    }
  }
  const raw* trow(int64_t node) const { return target + node * vocab; }
  const raw* drow(int64_t node) const { return draft + node * vocab; }
  const RowStats& tstat(int64_t node) {
    if (!have_t[node]) {
      const float* y = nullptr;
      tstats[node] = row_stats<L>(trow(node), vocab, sp, thread_scratch(vocab), y);
      have_t[node] = 1;
    }
    return tstats[node];
  }
  const RowStats& dstat(int64_t node) {
    if (!have_d[node]) {
      const float* y = nullptr;
      dstats[node] = row_stats<L>(drow(node), vocab, sp, thread_scratch(vocab), y);
      have_d[node] = 1;
    }
    return dstats[node];
  }
  bool child_of(int64_t c, int64_t node) const { return present[c] && par[c] == node; }
  float prob(const raw* row, const RowStats& st, int64_t x) const { return st.prob(x, L::load(row[x]) / st.divisor); }

  // Greedy: choice[node] = its child on a longest path of target-argmax nodes (or -1).
  Walk greedy_walk(std::vector<int64_t>& path) {
    std::vector<int64_t> best(n, 0), choice(n, -1);
    for (int64_t i = n - 1; i >= 1; --i) {  // descending: children are final before their parent is read
      if (!present[i]) continue;
      const int64_t p = par[i];
      if (tok[i] != tstat(p).greedy) continue;
      if (best[i] + 1 >= best[p]) { best[p] = best[i] + 1; choice[p] = i; }  // '>=': lower indices win ties
    }
    Walk w;
    while (choice[w.final_node] >= 0) {
      w.final_node = choice[w.final_node];
      path[++w.depth] = w.final_node;
    }
    return w;
  }

  // Sampling: recursive rejection over each node's children, in index order.
  Walk sampled_walk(std::vector<int64_t>& path, int64_t seed, int64_t offset) {
    Walk w;
    float mass = 1.0f;
    bool mass_stale = false;  // W after a rejection: computed only if a later sibling needs it
    for (int64_t c = 1; c < n; ++c) {
      const int64_t cur = w.final_node;
      if (!child_of(c, cur)) continue;
      const int64_t x = tok[c];
      const RowStats& qs = tstat(cur);
      const float qx = prob(trow(cur), qs, x);
      const float u = uniform_from_bits(philox_bits(philox_key(seed, offset, c - 1, kStreamAccept), 0));
      bool ok, repeat = false;
      float px = 0.0f;
      if (draft != nullptr) {
        const RowStats& ps = dstat(cur);
        if (mass_stale) { mass = residual_mass<L>(trow(cur), qs, drow(cur), ps, w.lam, vocab); mass_stale = false; }
        px = prob(drow(cur), ps, x);
        const float rest = qx - w.lam * px;
        ok = px > 0.0f && u * px * mass < (rest > 0.0f ? rest : 0.0f);
      } else {
        for (int64_t s = 1; s < c && !repeat; ++s) repeat = child_of(s, cur) && tok[s] == x;
        ok = !repeat && u * mass < qx;
      }
      if (ok) {
        w.final_node = c;
        path[++w.depth] = c;
        w.lam = 0.0f;
        mass = 1.0f;
        mass_stale = false;
        w.removed.clear();
      } else if (draft != nullptr) {
        w.lam = w.lam + mass;
        mass_stale = true;
      } else {
        if (!repeat) { mass = mass - qx; w.removed.push_back(x); }
        w.lam = 1.0f;
      }
    }
    return w;
  }
};

// Gumbel-max over tokens [v0, v1) of the final node's row: q (std + G) and, when a child was
// rejected, the residual max(q - lam * p~, 0) (log r + G).
template <class L>
ChunkBest final_chunk(const typename L::raw* qrow, const RowStats& qs, const typename L::raw* prow, const RowStats* ps,
                      const Walk& w, const PhiloxKey& key, int64_t v0, int64_t v1) {
  if (w.lam == 0.0f) return token_chunk<L>(qrow, qs, false, DraftSide<L>{}, key, v0, v1);
  ChunkBest best;
  alignas(64) float g[kBlock], sq[kBlock], sr[kBlock], q[kBlock], p[kBlock];
  for (int64_t b0 = v0; b0 < v1; b0 += kBlock) {
    const int64_t n = std::min(kBlock, v1 - b0);
    gumbel_block(key, b0, kBlock, g);  // one Philox call per four indices
    for (int64_t i = 0; i < n; ++i) sq[i] = L::load(qrow[b0 + i]) / qs.divisor;
    for (int64_t i = n; i < kBlock; ++i) sq[i] = kNegInf;
    for (int64_t i = 0; i < kBlock; ++i) {
      const float y = sq[i], e = fast_exp(y - qs.max);
      const bool keep = qs.kept(y, e);
      q[i] = select(keep, e * qs.inv_z, 0.0f);
      sq[i] = select(keep, y, kNegInf) + g[i];
    }
    if (ps != nullptr) {
      block_probs<L>(prow, *ps, b0, n, p);
    } else {  // deterministic children: p~ = indicator of the rejected tokens (lam = 1)
      for (int64_t i = 0; i < kBlock; ++i) p[i] = 0.0f;
      for (int64_t t : w.removed)
        if (t >= b0 && t < b0 + n) p[t - b0] = 1.0f;
    }
    const float lam = w.lam;
    float rmax[kLanes] = {};
    for (int64_t i = 0; i < kBlock; ++i) {
      const float d = q[i] - lam * p[i];
      q[i] = select(d > 0.0f, d, 0.0f);  // q now holds the residual r
    }
    for (int64_t i = 0; i < kBlock; i += kLanes)
      for (int l = 0; l < kLanes; ++l) rmax[l] = q[i + l] > rmax[l] ? q[i + l] : rmax[l];
    for (int64_t i = 0; i < kBlock; ++i) sr[i] = fast_log(q[i]) + g[i];
    best.r_mass = best.r_mass || lanes_max(rmax) > 0.0f;
    float s;
    int64_t i = block_argmax(sr, s);
    if (i >= 0 && (best.r_index < 0 || s > best.r_score)) { best.r_score = s; best.r_index = static_cast<int32_t>(b0 + i); }
    i = block_argmax(sq, s);
    if (i >= 0 && (best.q_index < 0 || s > best.q_score)) { best.q_score = s; best.q_index = static_cast<int32_t>(b0 + i); }
  }
  return best;
}

template <class L>
void tree_verify_impl(const at::Tensor& target_t, const c10::optional<at::Tensor>& draft_t, const int64_t* tokens,
                      const int64_t* parents, const Params& prm, int32_t* out_tokens, int32_t* out_path, int32_t* out_accepted) {
  using raw = typename L::raw;
  const int64_t batch = target_t.size(0), n = target_t.size(1), vocab = target_t.size(2);
  const raw* target = reinterpret_cast<const raw*>(target_t.data_ptr());
  const raw* draft = draft_t.has_value() ? reinterpret_cast<const raw*>(draft_t->data_ptr()) : nullptr;

  // The rows' structure (and the token check, which may throw) outside the parallel region.
  std::vector<Row<L>> rows;
  rows.reserve(batch);
  for (int64_t b = 0; b < batch; ++b)
    rows.emplace_back(target + b * n * vocab, draft ? draft + b * n * vocab : nullptr, tokens + b * n, parents + b * n, n,
                      vocab, prm.row(b));
  std::vector<Walk> walks(batch);
  std::vector<std::vector<int64_t>> paths(batch, std::vector<int64_t>(n, -1));
  // Phase 1: the walks (rows are independent).
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
  for (int64_t b = 0; b < batch; ++b) {
    paths[b][0] = 0;
    walks[b] = prm.temperature[b] > 0.0f ? rows[b].sampled_walk(paths[b], prm.seed[b], prm.offset[b])
                                         : rows[b].greedy_walk(paths[b]);
    rows[b].tstat(walks[b].final_node);  // phase 2 reads it from several threads
    if (walks[b].lam != 0.0f && draft != nullptr) rows[b].dstat(walks[b].final_node);
  }
  // Phase 2: the emitted token at each final node.
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  std::vector<ChunkBest> best(static_cast<size_t>(batch * chunks));
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
  for (int64_t item = 0; item < batch * chunks; ++item) {
    const int64_t b = item / chunks, c = item % chunks;
    Row<L>& row = rows[b];
    const Walk& w = walks[b];
    const RowStats& qs = row.tstats[w.final_node];
    if (qs.greedy >= 0) continue;
    const PhiloxKey key = philox_key(prm.seed[b], prm.offset[b], w.depth, kStreamToken);
    const RowStats* ps = w.lam != 0.0f && draft != nullptr ? &row.dstats[w.final_node] : nullptr;
    const int64_t v0 = c * kChunk, v1 = std::min(vocab, v0 + kChunk);
    best[item] = final_chunk<L>(row.trow(w.final_node), qs, ps ? row.drow(w.final_node) : nullptr, ps, w, key, v0, v1);
  }
  for (int64_t b = 0; b < batch; ++b) {
    const Walk& w = walks[b];
    const RowStats& qs = rows[b].tstats[w.final_node];
    int64_t y;
    if (qs.greedy >= 0) {
      y = qs.greedy;
    } else {
      ChunkBest merged;
      for (int64_t c = 0; c < chunks; ++c) merged.merge(best[b * chunks + c]);
      y = (w.lam != 0.0f && merged.r_mass) ? merged.r_index : merged.q_index;
    }
    for (int64_t d = 0; d < n; ++d) {
      out_path[b * n + d] = static_cast<int32_t>(paths[b][d]);
      out_tokens[b * n + d] = d < w.depth ? static_cast<int32_t>(tokens[b * n + paths[b][d + 1]]) : -1;
    }
    out_tokens[b * n + w.depth] = static_cast<int32_t>(y);
    out_accepted[b] = static_cast<int32_t>(w.depth);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify(
    const at::Tensor& target_logits, const c10::optional<at::Tensor>& draft_logits, const at::Tensor& tokens,
    const at::Tensor& parents, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& min_p, const at::Tensor& seed, const at::Tensor& offset) {
  check_logits(target_logits, 3, "target_logits");
  const int64_t batch = target_logits.size(0), n = target_logits.size(1), vocab = target_logits.size(2);
  TORCH_CHECK(n >= 1 && vocab >= 1, "target_logits must be [B, N >= 1, V >= 1], got ", target_logits.sizes());
  TORCH_CHECK(vocab < (int64_t(1) << 31), "vocab too large: ", vocab);
  if (draft_logits.has_value()) {
    check_logits(*draft_logits, 3, "draft_logits");
    TORCH_CHECK(draft_logits->scalar_type() == target_logits.scalar_type(), "draft_logits dtype differs from target_logits");
    TORCH_CHECK(draft_logits->sizes() == target_logits.sizes(), "draft_logits must be [B, N, V] = ", target_logits.sizes(),
                ", got ", draft_logits->sizes());
  }
  for (const at::Tensor* t : {&tokens, &parents})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous() && t->dim() == 2 &&
                    t->size(0) == batch && t->size(1) == n,
                "tokens and parents must be contiguous CPU int64 tensors [B, N], got ", t->scalar_type(), " ", t->sizes());
  const Params prm = check_params(batch, temperature, top_k, top_p, min_p, seed, offset);
  at::Tensor out_tokens = at::empty({batch, n}, target_logits.options().dtype(at::kInt));
  at::Tensor path = at::empty({batch, n}, target_logits.options().dtype(at::kInt));
  at::Tensor accepted = at::empty({batch}, target_logits.options().dtype(at::kInt));
  dispatch_dtype(target_logits.scalar_type(), [&](auto loader) {
    tree_verify_impl<decltype(loader)>(target_logits, draft_logits, tokens.data_ptr<int64_t>(), parents.data_ptr<int64_t>(),
                                       prm, out_tokens.data_ptr<int32_t>(), path.data_ptr<int32_t>(),
                                       accepted.data_ptr<int32_t>());
  });
  return {out_tokens, path, accepted};
}

}  // namespace
}  // namespace tree
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "tree_verify(Tensor target_logits, Tensor? draft_logits, Tensor tokens, Tensor parents, Tensor temperature, "
      "Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor offset) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) { m.impl("tree_verify", &specdec::tree::tree_verify); }
