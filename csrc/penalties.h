// Repetition / frequency / presence penalties on raw logits, applied where the verify and sample
// ops load them (standardise.h's scaled_row, token_pass.h's token_chunk). The spec is
// kernels/penalties/reference.py: with count = the row's output count of v (state bits 0-29)
// plus v's occurrences among the tokens before this position,
//   seen (in the prompt: bit 30, or count > 0):  z = z < 0 ? z * r : z / r
//   z = z - f * count;   z = z - pr * (count > 0)
// each operation rounded to float (the build has -ffp-contract=off: no fused multiply-add, so the
// bits equal torch's and Triton's).
#pragma once

#include <cstdint>

namespace specdec {

constexpr int32_t kCountMask = (1 << 30) - 1;  // bits 0-29 of a state word: the output count

// The penalties of one distribution: its row's state and parameters, and the generated tokens in
// front of its position that the state does not hold yet (a chain's drafts x_0..x_{i-1}, sample's
// prefix). Passed by pointer; nullptr everywhere means no penalties (the unchanged code path).
struct RowPenalty {
  const int32_t* counts = nullptr;  // [V] state words of the row
  float repetition = 1.0f;
  float frequency = 0.0f;
  float presence = 0.0f;
  const int64_t* tokens = nullptr;  // [ntok]; entries outside [0, V) are not tokens
  int64_t ntok = 0;
};

inline float penalise(float z, int32_t state, int32_t extra, const RowPenalty& p) {
  const int32_t count = (state & kCountMask) + extra;
  const bool seen = (state != 0) | (extra != 0);  // state bits: the prompt bit or an output count
  z = seen ? (z < 0.0f ? z * p.repetition : z / p.repetition) : z;
  z = z - p.frequency * static_cast<float>(count);
  return z - p.presence * (count > 0 ? 1.0f : 0.0f);
}

// y[i] = penalise(raw[i]) / divisor for tokens [v0, v0 + n) of a row (raw points at token v0).
// The vectorised pass reads the state alone; the few tokens in front of the position (K <= ~8)
// then redo their own entries (each distinct token once): O(n + ntok^2), not O(n * ntok).
// Measured (1 thread, AVX-512, V = 32000, K = 4, bench/results/verify_penalties_cpu_avx512.json):
// chain_verify +8-14% with sampling, +30% (B = 1) / +59% (B = 8) greedy, whose penalty-free rows
// are one in-place max over float32 logits: the penalised row also reads 4 bytes of counts per
// logit and writes the scratch row. A sparse list of seen tokens would cost O(seen) instead.
template <class L>
void penalised_block(const typename L::raw* raw, int64_t v0, int64_t n, float divisor, const RowPenalty& p, float* y) {
  const int32_t* state = p.counts + v0;
  for (int64_t i = 0; i < n; ++i) y[i] = penalise(L::load(raw[i]), state[i], 0, p) / divisor;
  for (int64_t j = 0; j < p.ntok; ++j) {
    const int64_t t = p.tokens[j];
    if (t < v0 || t >= v0 + n) continue;
    int32_t extra = 0;
    bool first = true;
    for (int64_t i = 0; i < p.ntok; ++i) {
      extra += p.tokens[i] == t ? 1 : 0;
      first = first && !(i < j && p.tokens[i] == t);
    }
    if (first) y[t - v0] = penalise(L::load(raw[t - v0]), state[t - v0], extra, p) / divisor;
  }
}

}  // namespace specdec
