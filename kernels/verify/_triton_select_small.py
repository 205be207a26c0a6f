"""Launch 1 of the verify step for small vocabularies (V <= CAP): statistics and exact top-k /
top-p / min-p thresholds of BLOCK_R whole rows per program, held in registers (glossary:
_triton_common.py). One pass over the logits, no candidates, no second launch: a row of at
most CAP values is its own candidate set, searched like the large-vocab kernel's gathered
regions (_triton_search.py). GREEDY_TOKENS (every row greedy, known on the host): each row also
takes a ticket of its batch row, and the one completing it writes the row's tokens
(_triton_greedy.py): the verify step is then this launch and the zero fill.
"""
import triton
import triton.language as tl

from .._triton_sync import last_rows_of
from ..penalties.triton import row_penalty
from ._triton_common import (BIG_INDEX, E_ONE, KEY_NEG_INF, KEY_NONE, NEG_INF, fixed_mass, fixed_prob,
                             load_x_rows, num_drafts, order_key, passes_min_p, position_of, row_source, sampling_modes,
                             vocab_index)
from ._triton_greedy import write_greedy_tokens
from ._triton_search import largest_key_reaching


@triton.jit
def _mass_at_least(key, e, t):
    """[R] fp32 sums of e [R, C] over key >= t [R], summed in fixed point (any order, one result)."""
    fixed = tl.sum(tl.where(key >= t[:, None], fixed_mass(e), 0), axis=1)
    return (fixed.to(tl.float64) / E_ONE).to(tl.float32)


@triton.jit
def select_small_vocab_kernel(
    target_ptr, draft_ptr, tokens_ptr,  # logits [B, K+1, V], [B, K, V] (target again when absent); drafts int [B, K]
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B]: fp32, int32, fp32, fp32
    m_ptr, s2_ptr, s3_ptr, tkey_ptr, amax_ptr,  # [R] outputs: fp32 x3, int64, int32
    row_ticket_ptr, out_ptr, num_accepted_ptr,  # GREEDY_TOKENS: int32 [B] tickets (zeroed); int32 [B, K+1], [B]
    R, NPOS, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    V: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_VF: tl.constexpr, BLOCK_K: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, FENCE: tl.constexpr,
):
    """grid (cdiv(R, BLOCK_R),): rows r = program * BLOCK_R + [0, BLOCK_R) of R = B * NPOS
    distributions, each row whole in a [BLOCK_R, BLOCK_VF >= V] tile. No penalties."""
    _select_small_vocab(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, m_ptr,
                        s2_ptr, s3_ptr, tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr, num_accepted_ptr, R, NPOS, st_b,
                        st_k, sd_b, sd_k, sx_b, sx_k, so_b, (tokens_ptr,), False, V, K, BLOCK_R, BLOCK_VF, BLOCK_K,
                        GREEDY_TOKENS, HAS_DRAFT_LOGITS, BLOCK_K1, FENCE)


@triton.jit
def select_small_vocab_penalised_kernel(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, m_ptr, s2_ptr, s3_ptr,
    tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr, num_accepted_ptr, R, NPOS, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb, s_pk,  # penalties
    V: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_VF: tl.constexpr, BLOCK_K: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, FENCE: tl.constexpr,
    W: tl.constexpr, P0: tl.constexpr,
):
    """select_small_vocab_kernel with penalties (the arguments of
    _triton_select_stream.select_stream_penalised_kernel)."""
    _select_small_vocab(target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, m_ptr,
                        s2_ptr, s3_ptr, tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr, num_accepted_ptr, R, NPOS, st_b,
                        st_k, sd_b, sd_k, sx_b, sx_k, so_b,
                        (W, P0, counts_ptr, repetition_ptr, frequency_ptr, presence_ptr, pen_tokens_ptr, s_cb, s_pb,
                         s_pk), True, V, K, BLOCK_R, BLOCK_VF, BLOCK_K, GREEDY_TOKENS, HAS_DRAFT_LOGITS, BLOCK_K1,
                        FENCE)


@triton.jit
def _select_small_vocab(
    target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, m_ptr, s2_ptr, s3_ptr,
    tkey_ptr, amax_ptr, row_ticket_ptr, out_ptr, num_accepted_ptr, R, NPOS, st_b, st_k, sd_b, sd_k, sx_b, sx_k, so_b,
    pen_args, PENALTY: tl.constexpr,
    V: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_VF: tl.constexpr, BLOCK_K: tl.constexpr,
    GREEDY_TOKENS: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_K1: tl.constexpr, FENCE: tl.constexpr,
):
    """The selection of one row tile; pen_args: the penalties or (False,)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < R
    r = tl.minimum(r, R - 1)
    b = r // NPOS
    kb = num_drafts(tokens_ptr, b, sx_b, sx_k, K, BLOCK_K)
    t_off, d_off, t_lim, d_lim = row_source(r, NPOS, kb, st_b, st_k, sd_b, sd_k, V, K)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    min_p = tl.load(min_p_ptr + b)
    temp = tl.where(t > 0, t, 1.0)
    needed = t_lim + d_lim > 0
    topk_on, topp_on, minp_on = sampling_modes(t, top_k, top_p, min_p, needed, V)

    pen = pen_args
    if PENALTY:  # per row, as [BLOCK_R, 1] columns
        pen = row_penalty(pen_args, b[:, None], position_of(r, NPOS, K)[:, None])

    idx = tl.arange(0, BLOCK_VF)
    x = load_x_rows(target_ptr, draft_ptr, t_off, d_off, t_lim, d_lim, idx, temp, pen, PENALTY)  # [BLOCK_R, BLOCK_VF]
    m = tl.max(x, axis=1)
    amax = tl.min(tl.where(x == m[:, None], idx[None, :], BIG_INDEX), axis=1)
    m = tl.where(needed, m, 0.0)  # positions never read: harmless numbers instead of -inf / 0
    e = tl.where(x > NEG_INF, tl.exp(x - m[:, None]), 0.0)
    s = tl.where(needed, tl.sum(e, axis=1), 1.0)
    key = tl.where(idx[None, :] < V, order_key(x), KEY_NONE)
    top = order_key(m) + 1  # no key reaches it: every search's upper end

    # top-k: the k-th largest key (ties with it stay). Rows not searching start converged.
    t_k = largest_key_reaching(key, (key != KEY_NONE).to(tl.int64), top_k.to(tl.int64),
                               tl.where(topk_on, KEY_NEG_INF, top - 1), top)
    t_k = tl.where(topk_on, t_k, KEY_NEG_INF)
    s2k = tl.where(topk_on, _mass_at_least(key, e, t_k), s)
    # top-p within the top-k set: the smallest kept key, from fixed-point probabilities.
    prob = tl.where(key >= t_k[:, None], fixed_prob(tl.div_rn(e, s2k[:, None])), 0)
    t_p = largest_key_reaching(key, prob, fixed_prob(top_p.to(tl.float64)), tl.where(topp_on, t_k, top - 1), top)
    tkey = tl.where(topp_on, t_p, t_k)
    s2 = tl.where(topk_on | topp_on, _mass_at_least(key, e, tkey), s)
    # min-p, relative to the most probable token (e = 1 at the max).
    kept3 = (key >= tkey[:, None]) & passes_min_p(e, s2[:, None], min_p[:, None])
    s3 = tl.where(minp_on, _mass_at_least(tl.where(kept3, key, KEY_NONE), e, tkey), s2)
    tl.store(m_ptr + r, m, mask=live)
    tl.store(s2_ptr + r, s2, mask=live)
    tl.store(s3_ptr + r, s3, mask=live)
    tl.store(tkey_ptr + r, tkey, mask=live)
    tl.store(amax_ptr + r, vocab_index(amax, V), mask=live)
    if GREEDY_TOKENS:  # every row greedy: the lane completing a batch row writes its tokens
        last = last_rows_of(row_ticket_ptr + b, live, NPOS, FENCE)
        write_greedy_tokens(tokens_ptr, amax_ptr, out_ptr, num_accepted_ptr, b, last, NPOS, sx_b, sx_k, so_b, V, K,
                            HAS_DRAFT_LOGITS, BLOCK_K, BLOCK_K1)
