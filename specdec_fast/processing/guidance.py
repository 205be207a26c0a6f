"""generate(guidance_scale=s, negative_prompt_ids=..., negative_prompt_attention_mask=...):
classifier-free guidance, transformers' UnbatchedClassifierFreeGuidanceLogitsProcessor, at every
speculative position of the target.

transformers' rule (generation/logits_process.py, decoder-only models; the first processor of
_get_logits_processor): at each step the scores become

    s = log_softmax(scores);  u = log_softmax(model(unconditional sequence)[last]);  s' = g (s - u) + u

where the unconditional sequence is the negative prompt (its own attention mask; without one,
the row's last prompt token) followed by every token generated so far, run by the same model
over its own cache: no position_ids, so its positions count from 0 over the negative prompt,
pads included. guidance_scale 1 builds no processor.

Here: a position whose prefix is the prompt, the generated tokens g and the drafts d_1..d_j
(j drafts seen) needs the model's last logits over U ++ g ++ d_1..d_j. Each row keeps its own
batch-1 cache of the unconditional stream and the tokens it holds: every call crops it to what
it shares with the stream this call needs (the committed tokens survive, rejected drafts go), feeds
the rest in one forward, and reads the logits of every position it needs (from the last
committed token on: it re-feeds that one, whose logits the cache does not keep). So the target
side costs one extra forward of about K + 1 tokens per row and iteration (transformers: one per
token), eager (a host loop over rows; not graph safe). The draft side does not guide: its
proposals stay exact for any draft distribution, guidance on it would only raise the acceptance
at the cost of the same forwards again.
"""
import torch

GRAPH_NOTE = ("guidance_scale runs the model's unconditional forward on the host per row (its own cache), which a "
              "CUDA graph cannot replay")


def guidance_on(scale) -> bool:
    """Whether guidance_scale builds a guidance (transformers: not None and not 1; at 1 it builds
    nothing and the negative prompt is unread). The one rule the engine, the stage and the
    tensor-parallel checks ask."""
    return scale is not None and scale != 1


def check_guidance(scale, negative_ids, negative_mask, batch: int, return_sequences: int) -> None:
    """transformers' inputs for guidance, checked before a call (ValueError naming the problem):
    scale a real number; negative_prompt_ids int [batch, U]; its mask [batch, U] of 0 / 1."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"guidance_scale must be a number, got {scale!r}")
    if negative_ids is None:
        if negative_mask is not None:
            raise ValueError("negative_prompt_attention_mask without negative_prompt_ids")
        return
    if not isinstance(negative_ids, torch.Tensor) or negative_ids.dim() != 2 or negative_ids.dtype not in (
            torch.int32, torch.int64) or negative_ids.shape[1] == 0:
        raise ValueError("negative_prompt_ids must be an int tensor [batch, length >= 1], got "
                         f"{getattr(negative_ids, 'shape', type(negative_ids).__name__)}")
    if return_sequences > 1:
        raise ValueError(f"negative_prompt_ids with num_return_sequences={return_sequences}: the negative prompt has "
                         "a row per prompt, not per sequence (transformers' generate fails on it too)")
    if negative_ids.shape[0] != batch:
        raise ValueError(f"negative_prompt_ids has {negative_ids.shape[0]} rows and input_ids {batch}")
    if negative_mask is not None:
        if not isinstance(negative_mask, torch.Tensor) or tuple(negative_mask.shape) != tuple(negative_ids.shape):
            raise ValueError(f"negative_prompt_attention_mask must be a tensor shaped as negative_prompt_ids "
                             f"{tuple(negative_ids.shape)}")
        if bool(((negative_mask != 0) & (negative_mask != 1)).any()):
            raise ValueError("negative_prompt_attention_mask must hold only 0 and 1")


class ClassifierFreeGuidance:
    """The guidance stage of one call (module docstring). scale: guidance_scale (!= 1); model:
    the target (a transformers causal LM); negative_ids int [B, U] or None (then each row's last
    prompt token); negative_mask [B, U] or None (ones)."""

    graph_safe = False
    graph_note = GRAPH_NOTE

    def __init__(self, scale: float, model, prompt_width: int, negative_ids=None, negative_mask=None):
        from ..runners.hf import cache_keyword

        self.scale, self.model, self.prompt_width = float(scale), model, int(prompt_width)
        self.negative_ids, self.negative_mask = negative_ids, negative_mask
        self.cache_keyword = cache_keyword(model)
        self.rows = None
        self._streams = {}  # row -> [its unconditional stream's cache, the tokens that cache holds (list)]

    def set_prompt_width(self, prompt_width: int) -> None:
        self.prompt_width = int(prompt_width)

    def set_rows(self, rows: int) -> None:
        self.rows = rows

    def _unconditional(self, row: int, seq: torch.Tensor) -> tuple:
        """(tokens, mask) of row's negative prompt as lists: negative_prompt_ids[row] with its mask,
        or the row's last prompt token."""
        if self.negative_ids is None:
            return [int(seq[row, self.prompt_width - 1])], [1]
        ids = self.negative_ids[row].tolist()
        mask = [1] * len(ids) if self.negative_mask is None else [int(v) for v in self.negative_mask[row].tolist()]
        return ids, mask

    @torch.no_grad()
    def _logprobs(self, row: int, stream: list, mask: list, needed: list) -> torch.Tensor:
        """log_softmax of the model's logits at stream positions ``needed`` (ascending) -> [len, V]
        in the model's dtype, as transformers computes them; the row's cache then holds stream."""
        from transformers import DynamicCache

        state = self._streams.get(row)
        if state is None:
            state = self._streams[row] = [DynamicCache(), []]
        cache, held = state
        common = 0
        for a, b in zip(held, stream):
            if a != b:
                break
            common += 1
        keep = min(common, needed[0])  # the first needed position is fed again (its logits are not kept)
        if keep == 0:
            cache = state[0] = DynamicCache()
        elif keep < len(held):
            cache.crop(keep - len(held))  # a negative count removes that many (transformers 4.x and 5.x alike)
        device = next(self.model.parameters()).device
        ids = torch.tensor([stream[keep:]], dtype=torch.long, device=device)
        attention = torch.tensor([mask[: len(stream)]], dtype=torch.long, device=device)
        out = self.model(ids, attention_mask=attention, use_cache=True, **{self.cache_keyword: cache})
        state[1] = list(stream)
        return torch.log_softmax(out.logits[0, [p - keep for p in needed]], dim=-1)

    def apply_(self, logits: torch.Tensor, prefixes) -> None:
        """logits [B, N, V] (float32) guided in place at every real position (host loop per row).
        A chain's positions only: each row's unconditional stream is one cache, extended by its drafts."""
        if prefixes.group != 1:
            raise ValueError("guidance_scale guides a chain's positions, not a token tree's nodes")
        ends, drafts, seen_by = prefixes.end.tolist(), prefixes.drafts.tolist(), prefixes.seen.tolist()
        rows = len(ends) if self.rows is None else min(self.rows, len(ends))
        for b in range(rows):
            position_of = {j: i for i, j in enumerate(seen_by[b])}  # drafts seen -> position (ascending)
            seen = [j for j in seen_by[b] if all(t >= 0 for t in drafts[b][:j])]  # a padded draft: never emitted
            if not seen:
                continue
            negative, negative_mask = self._unconditional(b, prefixes.seq)
            generated = prefixes.seq[b, self.prompt_width: ends[b]].tolist()
            stream = negative + generated + drafts[b][: seen[-1]]
            mask = negative_mask + [1] * (len(stream) - len(negative))
            base = len(negative) + len(generated) - 1  # the stream position whose logits follow j = 0 drafts
            unconditional = self._logprobs(b, stream, mask, [base + j for j in seen])
            for k, j in enumerate(seen):
                i = position_of[j]
                scores = torch.log_softmax(logits[b, i].float(), dim=-1)
                logits[b, i] = self.scale * (scores - unconditional[k]) + unconditional[k]
