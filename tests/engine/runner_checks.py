"""Shared checks of a paged runner against its model's own forward (Llama family and GPT-2)."""
import torch


def hf_logits(model, tokens) -> torch.Tensor:
    """The model's own forward on one unpadded row -> logits [len, V] (on the CPU)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens], device=model.device)).logits[0].cpu()


def assert_runner_matches_forward(model, runner, vocab: int) -> list:
    """Prefill a left-padded batch of 3 (lengths 5/9/1), then left-padded score calls (the
    drafter's pattern), commits with rollback and full calls: every real token's logits equal
    the model's forward on the row's context so far; committed lengths follow. -> contexts."""
    from .models import left_padded_prompts

    ids, mask = left_padded_prompts([5, 9, 1], vocab=vocab, seed=1)
    contexts = [ids[b, mask[b].bool()].tolist() for b in range(3)]
    dev = runner.device
    logits = runner.prefill(ids.to(dev), mask.to(dev)).cpu()
    for b in range(3):
        torch.testing.assert_close(logits[b], hf_logits(model, contexts[b])[-1], atol=1e-4, rtol=1e-4)
    gen = torch.Generator().manual_seed(2)
    calls = [(3, [1, 3, 2], [1, 2, 0]), (4, None, [4, 1, 3]), (2, [2, 1, 2], None), (1, None, [2, 0, 1])]
    pending = [[] for _ in range(3)]
    for width, num_valid, keep in calls:
        tokens = torch.randint(3, vocab, (3, width), generator=gen)
        valid = [width] * 3 if num_valid is None else num_valid
        out = runner.score(tokens.to(dev), None if num_valid is None else torch.tensor(valid, device=dev)).cpu()
        assert out.shape == (3, width, vocab)
        for b in range(3):
            new = tokens[b, width - valid[b] :].tolist()
            pending[b] += new
            expected = hf_logits(model, contexts[b] + pending[b])[-len(new) :]
            torch.testing.assert_close(out[b, width - valid[b] :], expected, atol=1e-4, rtol=1e-4)
        if keep is not None:
            runner.commit(torch.tensor(keep, device=dev))
            for b in range(3):
                contexts[b] += pending[b][: keep[b]]
                pending[b] = []
    assert runner.cache.seq_lens.tolist() == [len(c) for c in contexts]
    return contexts


def assert_bf16_close_to_forward(model, runner, vocab: int, reference=None) -> None:
    """bf16 weights and cache (the cast paths): prefill of a left-padded batch of 2 and one
    left-padded score call are within 3% of the logits' scale of the model's own bf16 forward
    (reference: another model's forward instead, e.g. the float32 original)."""
    from .models import left_padded_prompts

    ids, mask = left_padded_prompts([4, 7], vocab=vocab, seed=6)
    dev = runner.device
    logits = runner.prefill(ids.to(dev), mask.to(dev)).cpu()
    step = runner.score(torch.tensor([[5, 9], [3, 4]], device=dev), torch.tensor([2, 1], device=dev)).cpu()
    for b, new in enumerate(([5, 9], [4])):
        context = ids[b, mask[b].bool()].tolist()
        ref = hf_logits(model if reference is None else reference, context + new).float()
        scale = ref.abs().max()
        torch.testing.assert_close(logits[b].float(), ref[len(context) - 1], atol=0.03 * scale, rtol=0)
        torch.testing.assert_close(step[b, 2 - len(new) :].float(), ref[-len(new) :], atol=0.03 * scale, rtol=0)


def steps_without_sync(decoder, steps: int) -> None:
    """Run ``steps`` engine iterations on CUDA with torch.cuda.set_sync_debug_mode("error"):
    any host sync inside an iteration raises. The caller warms up first (allocator, lazy inits)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            decoder.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def assert_rollback_controls_fail(monkeypatch, runner_class, model, vocab: int, **runner_kw) -> None:
    """The recurrent runners' controls (runners/paged_recurrent.py), each spoiling one thing that
    assert_runner_matches_forward must then catch: (1) commit leaves the committed states as they were (no
    rollback to the kept tokens' snapshot); (2) every score call starts from the committed state (ignoring
    an uncommitted call before it)."""
    import pytest

    from specdec_fast.runners.paged_base import PagedRunnerBase

    with monkeypatch.context() as patch:
        patch.setattr(runner_class, "commit", PagedRunnerBase.commit)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner_class(model, **runner_kw), vocab)
    real = runner_class._row_layout

    def from_committed(self, cu, total, n):
        rows = real(self, cu, total, n)
        return rows._replace(start=torch.full_like(rows.start, -1))

    with monkeypatch.context() as patch:
        patch.setattr(runner_class, "_row_layout", from_committed)
        with pytest.raises(AssertionError):
            assert_runner_matches_forward(model, runner_class(model, **runner_kw), vocab)


def assert_greedy_paged_equals_generate(target, vocab: int, lengths=(4, 10, 7), extra=(), per_row: bool = False) -> None:
    """Greedy generate(runner="paged") of left-padded prompts of ``lengths`` equals target.generate with a draft
    model (rejections asserted: 0 < alpha < 1, so the rollback ran), prompt lookup, each of ``extra`` (drafting
    kwargs) and plain decoding; the target's engines are released after. per_row: the expected tokens are
    target.generate's of each row alone, unpadded (for a model whose padded batch transformers decodes wrongly;
    no EOS, so every row runs the whole budget)."""
    import specdec_fast
    import specdec_fast.api as api

    from .models import left_padded_prompts, make_draft

    ids, mask = left_padded_prompts(list(lengths), vocab=vocab, seed=len(lengths))
    kw = dict(do_sample=False, max_new_tokens=20, pad_token_id=0)
    if per_row:
        new = [target.generate(ids[b:b + 1, ids.shape[1] - n:], attention_mask=mask[b:b + 1, ids.shape[1] - n:],
                               **kw)[0, n:] for b, n in enumerate(lengths)]
        expected = torch.cat((ids, torch.stack(new)), dim=1)
    else:
        expected = target.generate(ids, attention_mask=mask, **kw)
    for drafting in (dict(assistant_model=make_draft(target, noise=0.03), num_assistant_tokens=3),
                     dict(prompt_lookup_num_tokens=2), *extra, {}):
        out, stats = api.generate(target, ids, mask, runner="paged", return_stats=True, **kw, **drafting)
        assert torch.equal(out, expected), drafting
        if "assistant_model" in drafting:
            assert 0 < stats.alpha < 1, stats.alpha
    specdec_fast.release_engines(target)
