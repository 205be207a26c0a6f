"""Tiny byte-level BPE tokenizers whose tokens split each other's, for drafting across tokenizers.

Target: a, b, c, space, the two bytes of "é" (0xC3, 0xA9) and the merges ab, " a", é, abc.
Draft: the same six symbols in another order and the merges bc, ca, "  ": no id means the same
token in both, "abc" is one target token and two draft tokens (a | bc), the draft's "ca" spans a
target boundary (abc | a ...), and either side may hold half of "é".
"""
TARGET_TOKENS = ["a", "b", "c", "Ġ", "Ã", "©", "ab", "Ġa", "Ã©", "abc"]
TARGET_MERGES = [("a", "b"), ("Ġ", "a"), ("Ã", "©"), ("ab", "c")]
DRAFT_TOKENS = ["Ã", "©", "c", "b", "a", "Ġ", "bc", "ca", "ĠĠ"]
DRAFT_MERGES = [("b", "c"), ("c", "a"), ("Ġ", "Ġ")]


def tiny_tokenizer(tokens, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_tokenizers():
    """(target tokenizer, draft tokenizer)."""
    return tiny_tokenizer(TARGET_TOKENS, TARGET_MERGES), tiny_tokenizer(DRAFT_TOKENS, DRAFT_MERGES)


def fit_draft(target, draft, tok, atok, *, rows: int = 24, new: int = 32, steps: int = 120, seed: int = 0):
    """Fits ``draft`` (in place) to the target's greedy text: the target continues ``rows`` random
    prompts, the text is re-encoded into the draft's tokens (drafters/token_bytes.py) and the
    draft learns it (cross-entropy, Adam). A random draft of another vocabulary agrees with the
    target too rarely to test acceptance; ~1 s on one core."""
    import torch

    from specdec_fast.drafters.token_bytes import TokenBytes, incomplete_tail

    from .models import left_padded_prompts

    ids, mask = left_padded_prompts([4 + i % 5 for i in range(rows)], vocab=len(TARGET_TOKENS), seed=seed)
    with torch.no_grad():
        out = target.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    tcodec, dcodec = TokenBytes(tok), TokenBytes(atok)
    seqs = []
    for row, m in zip(out, torch.cat([mask, torch.ones(rows, new, dtype=torch.long)], 1)):
        text = tcodec.bytes_of(row[m.bool()].tolist())
        seqs.append(dcodec.encode(text[: len(text) - incomplete_tail(text)]))
    width = min(len(s) for s in seqs)
    data = torch.tensor([s[:width] for s in seqs])
    torch.manual_seed(seed)
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    draft.train()
    for _ in range(steps):
        loss = draft(input_ids=data, labels=data).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()
    return draft
