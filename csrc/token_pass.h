// The emitted-token pass over one chunk of the vocab: Gumbel-max over the standardised target
// (y ~ q) and, after a rejection, over the residual max(q - p, 0) (y ~ normalise(residual)).
//
// Scores follow kernels/verify/reference.py exactly: std(v) + G(v) and log(residual(v)) + G(v),
// float32, argmax ties to the lowest index. Work is done in blocks of kBlock tokens, one simple
// loop per stage, so GCC vectorises the Philox rounds, the logs and the exps.
#pragma once

#include <cstdint>

#include "philox.h"
#include "standardise.h"

namespace specdec {

constexpr int64_t kBlock = 256;

// Best scores of one chunk; merged across chunks in vocab order with strict '>' (lowest index wins).
struct ChunkBest {
  float q_score = kNegInf;
  int32_t q_index = -1;
  float r_score = kNegInf;
  int32_t r_index = -1;
  bool r_mass = false;  // some residual entry > 0 in this chunk

  void merge(const ChunkBest& o) {
    if (o.q_index >= 0 && (q_index < 0 || o.q_score > q_score)) { q_score = o.q_score; q_index = o.q_index; }
    if (o.r_index >= 0 && (r_index < 0 || o.r_score > r_score)) { r_score = o.r_score; r_index = o.r_index; }
    r_mass = r_mass || o.r_mass;
  }
};

// Where p comes from in residual mode: a standardised draft row, or one-hot(draft_token).
template <class L>
struct DraftSide {
  const typename L::raw* row = nullptr;  // nullptr: p = one-hot(token)
  const RowStats* stats = nullptr;
  int64_t token = -1;
  const RowPenalty* pen = nullptr;  // the draft row's penalties (penalties.h), or nullptr
};

// First index of the block maximum of s[0..kBlock) (s padded with -inf), or -1 if all -inf/NaN.
inline int64_t block_argmax(const float* s, float& best) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = kNegInf;
  for (int64_t i = 0; i < kBlock; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = s[i + l] > acc[l] ? s[i + l] : acc[l];
  best = lanes_max(acc);
  for (int64_t i = 0; i < kBlock; ++i)
    if (s[i] == best) return i;
  return -1;
}

// Scans tokens [v0, v1) of target row `trow` (stats qs, non-greedy). residual: also score the
// residual against `draft` (only then is `draft` read). qpen: the target row's penalties, or nullptr.
template <class L>
ChunkBest token_chunk(const typename L::raw* trow, const RowStats& qs, bool residual, const DraftSide<L>& draft,
                      const PhiloxKey& key, int64_t v0, int64_t v1, const RowPenalty* qpen = nullptr) {
  ChunkBest best;
  alignas(64) float g[kBlock], sq[kBlock], sr[kBlock], yq[kBlock], yp[kBlock];
  for (int64_t b0 = v0; b0 < v1; b0 += kBlock) {
    const int64_t n = v1 - b0 < kBlock ? v1 - b0 : kBlock;
    gumbel_block(key, b0, kBlock, g);  // one Philox call per four indices
    if (qpen != nullptr) penalised_block<L>(trow + b0, b0, n, qs.divisor, *qpen, yq);
    else for (int64_t i = 0; i < n; ++i) yq[i] = L::load(trow[b0 + i]) / qs.divisor;
    for (int64_t i = n; i < kBlock; ++i) yq[i] = kNegInf;
    const float qmax = qs.max, kth = qs.kth, iz1 = qs.inv_z1, pc = qs.p_cut, iz2 = qs.inv_z2, mc = qs.min_cut, iz = qs.inv_z;
    if (!residual) {
      for (int64_t i = 0; i < kBlock; ++i) {
        const float y = yq[i], e = fast_exp(y - qmax);
        const bool keep = (y >= kth) & (e * iz1 >= pc) & (e * iz2 >= mc);  // '&': no branch
        sq[i] = select(keep, y, kNegInf) + g[i];
      }
    } else {
      // p for this block: from the draft row's stats, or one-hot at the draft token.
      if (draft.row != nullptr) {
        const RowStats& ps = *draft.stats;
        if (draft.pen != nullptr) penalised_block<L>(draft.row + b0, b0, n, ps.divisor, *draft.pen, yp);
        else for (int64_t i = 0; i < n; ++i) yp[i] = L::load(draft.row[b0 + i]) / ps.divisor;
        for (int64_t i = n; i < kBlock; ++i) yp[i] = kNegInf;
        const float pmax = ps.max, pk = ps.kth, pz1 = ps.inv_z1, ppc = ps.p_cut, pz2 = ps.inv_z2, pmc = ps.min_cut, pz = ps.inv_z;
        for (int64_t i = 0; i < kBlock; ++i) {
          const float y = yp[i], e = fast_exp(y - pmax);
          const bool keep = (y >= pk) & (e * pz1 >= ppc) & (e * pz2 >= pmc);
          yp[i] = select(keep, e * pz, 0.0f);  // yp now holds p
        }
      }
      if (draft.row == nullptr || draft.stats->greedy >= 0) {  // p one-hot
        const int64_t hot = draft.row == nullptr ? draft.token : draft.stats->greedy;
        for (int64_t i = 0; i < kBlock; ++i) yp[i] = b0 + i == hot ? 1.0f : 0.0f;
      }
      float rmax[kLanes] = {};
      for (int64_t i = 0; i < kBlock; ++i) {
        const float y = yq[i], e = fast_exp(y - qmax);
        const bool keep = (y >= kth) & (e * iz1 >= pc) & (e * iz2 >= mc);  // '&': no branch
        sq[i] = select(keep, y, kNegInf) + g[i];
        const float d = select(keep, e * iz, 0.0f) - yp[i];
        yp[i] = select(d > 0.0f, d, 0.0f);  // yp now holds the residual r
      }
      for (int64_t i = 0; i < kBlock; i += kLanes)
        for (int l = 0; l < kLanes; ++l) rmax[l] = yp[i + l] > rmax[l] ? yp[i + l] : rmax[l];
      for (int64_t i = 0; i < kBlock; ++i) sr[i] = fast_log(yp[i]) + g[i];
      best.r_mass = best.r_mass || lanes_max(rmax) > 0.0f;
      float s;
      const int64_t i = block_argmax(sr, s);
      if (i >= 0 && (best.r_index < 0 || s > best.r_score)) { best.r_score = s; best.r_index = static_cast<int32_t>(b0 + i); }
    }
    float s;
    const int64_t i = block_argmax(sq, s);
    if (i >= 0 && (best.q_index < 0 || s > best.q_score)) { best.q_score = s; best.q_index = static_cast<int32_t>(b0 + i); }
  }
  return best;
}

}  // namespace specdec
