// C++ CPU backend of the verify step and the sampler (kernels/verify/reference.py is the spec).
//
//   chain_verify(target [B,K+1,V], draft [B,K,V]?, draft_tokens [B,K], params..., penalties?) -> (tokens, num_accepted)
//   sample(logits [B,V], params..., position [B], stream, penalties?, prefix_tokens [B,W]?) -> tokens [B]
// penalties? = penalty_counts int32 [B,V], repetition, frequency, presence float32 [B] (all or
// none; penalties.h): every distribution's logits are penalised where they are read, position i
// with the drafts x_0..x_{i-1} (sample: the prefix) on top of the counts.
//
// Three phases, OpenMP loops over independent work items:
//  1. RowStats of the target rows i <= K_b and draft rows i < K_b, and q_i(x_i), p_i(x_i) for
//     the ratio test (no [B,K+1,V] probability tensor is kept): per row, stopping at the first
//     rejection, when there are at least as many rows as threads; else per (row, position).
//  2. per row: the accept coins and the first rejection j (a few flops).
//  3. (row, vocab chunk) items: Gumbel-max over row j (residual or bonus); chunks merge in order.
#include "aten_lean.h"
#include <torch/library.h>

#include <omp.h>

#include <vector>

#include "philox.h"
#include "standardise.h"
#include "token_pass.h"
#include "verify_args.h"

namespace specdec {
namespace {

constexpr int64_t kChunk = 16 * kBlock;  // vocab tokens per phase-3 work item (a multiple of kBlock)

// Phase 3 for rows whose target at position j[b] is not greedy: best per (row, chunk), merged.
template <class L>
void emit_tokens(const typename L::raw* target, const typename L::raw* draft, const int64_t* draft_tokens, int64_t batch,
                 int64_t positions, int64_t k, int64_t vocab, const Params& prm, const std::vector<RowStats>& tstats,
                 const std::vector<RowStats>& dstats, const std::vector<int64_t>& j, const std::vector<int64_t>& kb,
                 int stream, const Penalties& pens, std::vector<int64_t>& out) {
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  std::vector<ChunkBest> best(static_cast<size_t>(batch * chunks));
  const int64_t items = batch * chunks;
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
  for (int64_t item = 0; item < items; ++item) {
    const int64_t b = item / chunks, c = item % chunks;
    const RowStats& qs = tstats[b * positions + j[b]];
    if (qs.greedy >= 0) continue;
    const bool residual = j[b] < kb[b];
    // Position j[b] of both rows sees the drafts x_0..x_{j-1} on top of the counts.
    const RowPenalty pen = pens.on() ? pens.row(b, draft_tokens + b * k, j[b]) : RowPenalty{};
    DraftSide<L> side;
    if (residual) {
      side.token = draft_tokens[b * k + j[b]];
      if (draft != nullptr) {
        side.row = draft + (b * k + j[b]) * vocab;
        side.stats = &dstats[b * k + j[b]];
        side.pen = pens.on() ? &pen : nullptr;
      }
    }
    const PhiloxKey key = philox_key(prm.seed[b], prm.offset[b], j[b], stream);
    const int64_t v0 = c * kChunk, v1 = std::min(vocab, v0 + kChunk);
    best[item] = token_chunk<L>(target + (b * positions + j[b]) * vocab, qs, residual, side, key, v0, v1,
                                pens.on() ? &pen : nullptr);
  }
  for (int64_t b = 0; b < batch; ++b) {
    const RowStats& qs = tstats[b * positions + j[b]];
    if (qs.greedy >= 0) { out[b] = qs.greedy; continue; }  // std has one finite entry: argmax is it
    ChunkBest row;
    for (int64_t c = 0; c < chunks; ++c) row.merge(best[b * chunks + c]);
    out[b] = (j[b] < kb[b] && row.r_mass) ? row.r_index : row.q_index;
  }
}

template <class L>
void chain_verify_impl(const at::Tensor& target_t, const c10::optional<at::Tensor>& draft_t, const int64_t* tokens,
                       const Params& prm, const Penalties& pens, int32_t* out_tokens, int32_t* out_accepted) {
  using raw = typename L::raw;
  const int64_t batch = target_t.size(0), positions = target_t.size(1), vocab = target_t.size(2), k = positions - 1;
  const raw* target = reinterpret_cast<const raw*>(target_t.data_ptr());
  const raw* draft = draft_t.has_value() ? reinterpret_cast<const raw*>(draft_t->data_ptr()) : nullptr;

  std::vector<int64_t> kb(batch, 0);  // K_b: drafts before the first -1
  for (int64_t b = 0; b < batch; ++b) {
    while (kb[b] < k && tokens[b * k + kb[b]] >= 0) {
      TORCH_CHECK(tokens[b * k + kb[b]] < vocab, "draft_tokens must lie in [-1, V), got ", tokens[b * k + kb[b]]);
      ++kb[b];
    }
  }
  std::vector<RowStats> tstats(batch * positions), dstats(batch * k);
  std::vector<float> q_at(batch * k, 0.0f), p_at(batch * k, 1.0f);  // p = one-hot(x): p(x) = 1
  // RowStats of target (or draft) row (b, i), and its probability of the draft x_i.
  // Penalties: position i of either row sees the drafts x_0..x_{i-1} on top of the counts.
  auto stats_at = [&](int64_t b, int64_t i, bool is_draft) {
    const raw* row = is_draft ? draft + (b * k + i) * vocab : target + (b * positions + i) * vocab;
    const float* y = nullptr;
    const RowPenalty pen = pens.on() ? pens.row(b, tokens + b * k, i) : RowPenalty{};
    const RowStats st = row_stats<L>(row, vocab, prm.row(b), thread_scratch(vocab), y, pens.on() ? &pen : nullptr);
    (is_draft ? dstats[b * k + i] : tstats[b * positions + i]) = st;
    if (i < kb[b]) (is_draft ? p_at : q_at)[b * k + i] = st.prob(tokens[b * k + i], y[tokens[b * k + i]]);
  };
  // The ratio test u_i * p_i(x_i) < q_i(x_i) with p_i(x_i) > 0.
  auto accepts = [&](int64_t b, int64_t i) {
    const float u = uniform_from_bits(philox_bits(philox_key(prm.seed[b], prm.offset[b], i, kStreamAccept), 0));
    const float px = p_at[b * k + i], qx = q_at[b * k + i];
    return px > 0.0f && u * px < qx;
  };
  std::vector<int64_t> j(batch, 0);
  if (batch >= num_threads()) {
    // Enough rows for every thread: each row walks its positions and stops at the first
    // rejection, so positions past it are never standardised (B=8, K=4, V=32000, drafts from
    // bench_verify, 1 thread: 4.9 ms -> 3.6 ms per call, together with the in-place T=1 rows).
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0;; ++i) {
        stats_at(b, i, false);
        if (i == kb[b]) break;  // all accepted: the bonus position needs only its stats
        if (draft != nullptr) stats_at(b, i, true);
        if (!accepts(b, i)) break;
      }
    }
  } else {
    // Few rows: (row, position) items standardise every position in parallel, then the test.
    std::vector<int64_t> items;  // (b * positions + i) * 2 + is_draft
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i <= kb[b]; ++i) items.push_back((b * positions + i) * 2);
      if (draft != nullptr)
        for (int64_t i = 0; i < kb[b]; ++i) items.push_back((b * positions + i) * 2 + 1);
    }
    const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t bi = items[it] / 2;
      stats_at(bi / positions, bi % positions, items[it] % 2 == 1);
    }
  }
  for (int64_t b = 0; b < batch; ++b)
    while (j[b] < kb[b] && accepts(b, j[b])) ++j[b];
  std::vector<int64_t> y(batch);
  emit_tokens<L>(target, draft, tokens, batch, positions, k, vocab, prm, tstats, dstats, j, kb, kStreamToken, pens, y);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < positions; ++i) out_tokens[b * positions + i] = i < j[b] ? static_cast<int32_t>(tokens[b * k + i]) : -1;
    out_tokens[b * positions + j[b]] = static_cast<int32_t>(y[b]);
    out_accepted[b] = static_cast<int32_t>(j[b]);
  }
}

std::tuple<at::Tensor, at::Tensor> chain_verify(const at::Tensor& target_logits, const c10::optional<at::Tensor>& draft_logits,
                                                const at::Tensor& draft_tokens, const at::Tensor& temperature,
                                                const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p,
                                                const at::Tensor& seed, const at::Tensor& offset,
                                                const c10::optional<at::Tensor>& penalty_counts,
                                                const c10::optional<at::Tensor>& repetition,
                                                const c10::optional<at::Tensor>& frequency,
                                                const c10::optional<at::Tensor>& presence) {
  check_logits(target_logits, 3, "target_logits");
  const int64_t batch = target_logits.size(0), positions = target_logits.size(1), vocab = target_logits.size(2);
  TORCH_CHECK(positions >= 1 && vocab >= 1, "target_logits must be [B, K+1 >= 1, V >= 1], got ", target_logits.sizes());
  TORCH_CHECK(vocab < (int64_t(1) << 31), "vocab too large: ", vocab);
  if (draft_logits.has_value()) {
    check_logits(*draft_logits, 3, "draft_logits");
    TORCH_CHECK(draft_logits->scalar_type() == target_logits.scalar_type(), "draft_logits dtype differs from target_logits");
    TORCH_CHECK(draft_logits->size(0) == batch && draft_logits->size(1) == positions - 1 && draft_logits->size(2) == vocab,
                "draft_logits must be [B, K, V] = [", batch, ", ", positions - 1, ", ", vocab, "], got ", draft_logits->sizes());
  }
  TORCH_CHECK(draft_tokens.device().is_cpu() && draft_tokens.scalar_type() == at::kLong && draft_tokens.is_contiguous() &&
                  draft_tokens.dim() == 2 && draft_tokens.size(0) == batch && draft_tokens.size(1) == positions - 1,
              "draft_tokens must be a contiguous CPU int64 tensor [B, K], got ", draft_tokens.scalar_type(), " ", draft_tokens.sizes());
  const Params prm = check_params(batch, temperature, top_k, top_p, min_p, seed, offset);
  const Penalties pens = check_penalties(batch, vocab, penalty_counts, repetition, frequency, presence);
  at::Tensor tokens = at::empty({batch, positions}, target_logits.options().dtype(at::kInt));
  at::Tensor accepted = at::empty({batch}, target_logits.options().dtype(at::kInt));
  dispatch_dtype(target_logits.scalar_type(), [&](auto loader) {
    chain_verify_impl<decltype(loader)>(target_logits, draft_logits, draft_tokens.data_ptr<int64_t>(), prm, pens,
                                        tokens.data_ptr<int32_t>(), accepted.data_ptr<int32_t>());
  });
  return {tokens, accepted};
}

template <class L>
void sample_impl(const at::Tensor& logits_t, const Params& prm, const int64_t* position, int64_t stream,
                 const Penalties& pens, const int64_t* prefix, int64_t width, int32_t* out) {
  using raw = typename L::raw;
  const int64_t batch = logits_t.size(0), vocab = logits_t.size(1);
  const raw* logits = reinterpret_cast<const raw*>(logits_t.data_ptr());
  std::vector<RowStats> stats(batch);
  // Penalties: the counts plus the row's prefix tokens (the drafts of this iteration so far).
  std::vector<RowPenalty> pen(pens.on() ? batch : 0);
  for (int64_t b = 0; b < static_cast<int64_t>(pen.size()); ++b) pen[b] = pens.row(b, prefix + b * width, width);
  auto pen_of = [&](int64_t b) { return pens.on() ? &pen[b] : nullptr; };
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
  for (int64_t b = 0; b < batch; ++b) {
    const float* y = nullptr;
    stats[b] = row_stats<L>(logits + b * vocab, vocab, prm.row(b), thread_scratch(vocab), y, pen_of(b));
  }
  // Gumbel-max over standardise(logits) with the noise of (seed, offset, position, stream).
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  std::vector<ChunkBest> best(static_cast<size_t>(batch * chunks));
#pragma omp parallel for schedule(dynamic) num_threads(num_threads())
  for (int64_t item = 0; item < batch * chunks; ++item) {
    const int64_t b = item / chunks, c = item % chunks;
    if (stats[b].greedy >= 0) continue;
    const PhiloxKey key = philox_key(prm.seed[b], prm.offset[b], position[b], static_cast<int>(stream));
    const int64_t v0 = c * kChunk, v1 = std::min(vocab, v0 + kChunk);
    best[item] = token_chunk<L>(logits + b * vocab, stats[b], false, DraftSide<L>{}, key, v0, v1, pen_of(b));
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (stats[b].greedy >= 0) { out[b] = stats[b].greedy; continue; }
    ChunkBest row;
    for (int64_t c = 0; c < chunks; ++c) row.merge(best[b * chunks + c]);
    out[b] = row.q_index;
  }
}

at::Tensor sample(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                  const at::Tensor& min_p, const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& position,
                  int64_t stream, const c10::optional<at::Tensor>& penalty_counts,
                  const c10::optional<at::Tensor>& repetition, const c10::optional<at::Tensor>& frequency,
                  const c10::optional<at::Tensor>& presence, const c10::optional<at::Tensor>& prefix_tokens) {
  check_logits(logits, 2, "logits");
  const int64_t batch = logits.size(0);
  TORCH_CHECK(logits.size(1) >= 1 && logits.size(1) < (int64_t(1) << 31), "logits must be [B, V >= 1], got ", logits.sizes());
  TORCH_CHECK(stream >= 0 && stream < 256, "stream must lie in [0, 256), got ", stream);
  TORCH_CHECK(position.device().is_cpu() && position.scalar_type() == at::kLong && position.dim() == 1 &&
                  position.size(0) == batch && position.is_contiguous(),
              "position must be a contiguous CPU int64 tensor [B], got ", position.scalar_type(), " ", position.sizes());
  const Params prm = check_params(batch, temperature, top_k, top_p, min_p, seed, offset);
  const Penalties pens = check_penalties(batch, logits.size(1), penalty_counts, repetition, frequency, presence);
  const int64_t* prefix = nullptr;
  int64_t width = 0;
  if (prefix_tokens.has_value() && pens.on()) {
    TORCH_CHECK(prefix_tokens->device().is_cpu() && prefix_tokens->scalar_type() == at::kLong &&
                    prefix_tokens->is_contiguous() && prefix_tokens->dim() == 2 && prefix_tokens->size(0) == batch,
                "prefix_tokens must be a contiguous CPU int64 tensor [B, W], got ", prefix_tokens->scalar_type(), " ",
                prefix_tokens->sizes());
    prefix = prefix_tokens->data_ptr<int64_t>();
    width = prefix_tokens->size(1);
  }
  at::Tensor out = at::empty({batch}, logits.options().dtype(at::kInt));
  dispatch_dtype(logits.scalar_type(), [&](auto loader) {
    sample_impl<decltype(loader)>(logits, prm, position.data_ptr<int64_t>(), stream, pens, prefix, width,
                                  out.data_ptr<int32_t>());
  });
  return out;
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "chain_verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, "
      "Tensor top_p, Tensor min_p, Tensor seed, Tensor offset, Tensor? penalty_counts=None, Tensor? repetition=None, "
      "Tensor? frequency=None, Tensor? presence=None) -> (Tensor, Tensor)");
  m.def(
      "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor offset, "
      "Tensor position, int stream, Tensor? penalty_counts=None, Tensor? repetition=None, Tensor? frequency=None, "
      "Tensor? presence=None, Tensor? prefix_tokens=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("chain_verify", &specdec::chain_verify);
  m.impl("sample", &specdec::sample);
}
