"""Tiny EAGLE-3 heads for the tests: random, or trained for a second on a tiny target's own text
(specdec_fast.train) so that drafts are accepted often enough to exercise every commit path; and
the recording of a drafter's proposals that the reference-draft tests compare; the block drafters'
(DFlash, DFlash2) shared checks against their module's forward."""
import torch
import torch.nn.functional as F
import transformers as tf

from specdec_fast.heads import Eagle3Head
from specdec_fast.train import choose_draft_vocabulary, train_eagle3

from ..conftest import on_device

_CACHE = {}


def head_config(target, draft_vocab: int, ids=(1, 2, 3), **extra):
    config = target.config
    return tf.LlamaConfig(hidden_size=config.hidden_size, intermediate_size=2 * config.hidden_size, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=config.vocab_size,
                          draft_vocab_size=draft_vocab, rope_theta=500.0, eagle_aux_hidden_state_layer_ids=list(ids),
                          **extra)


def random_head(target, draft_vocab: int, *, seed: int = 0, std: float = 0.15, **extra) -> Eagle3Head:
    """A head with random weights and a random draft vocabulary of draft_vocab target tokens."""
    torch.manual_seed(seed)
    head = Eagle3Head(head_config(target, draft_vocab, **extra)).eval()
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, std)
    head.set_vocabulary(torch.randperm(target.config.vocab_size)[:draft_vocab])
    return head.requires_grad_(False)


def _teacher_text(target, rows: int, temperature: float, max_new_tokens: int) -> torch.Tensor:
    """``rows`` sampled continuations of 2 random tokens by the target (the heads' training text);
    then torch's seed is set to 1 for the head's own initialisation."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, target.config.vocab_size, (rows, 2), generator=gen)
    torch.manual_seed(0)
    with torch.no_grad():
        text = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                               temperature=temperature, max_new_tokens=max_new_tokens, pad_token_id=0)
    torch.manual_seed(1)
    return text


def trained_head(target, draft_vocab: int, *, key: str, steps: int = 200, rows: int = 512, temperature: float = 0.7):
    """A head trained on ``rows`` sampled continuations of the target (cached per session under key)."""
    if key not in _CACHE:
        vocab = target.config.vocab_size
        text = _teacher_text(target, rows, temperature, 22)
        head = Eagle3Head(head_config(target, draft_vocab))
        head.set_vocabulary(choose_draft_vocabulary(text, draft_vocab, vocab))
        train_eagle3(head, target, text, steps=steps, batch_size=16, unroll=3, lr=3e-3)
        _CACHE[key] = head
    return _CACHE[key]


def dflash_config(target, *, block_size: int = 8, ids=(0, 1, 2), layers: int = 2, mask_token_id: int = 3, **extra):
    config = target.config
    return tf.Qwen3Config(hidden_size=config.hidden_size, intermediate_size=2 * config.hidden_size,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          vocab_size=config.vocab_size, rope_theta=500.0, num_target_layers=config.num_hidden_layers,
                          block_size=block_size, dflash_config=dict(mask_token_id=mask_token_id, target_layer_ids=list(ids)),
                          **extra)


def random_dflash(target, *, seed: int = 0, std: float = 0.15, **kw):
    """A DFlash drafter with random weights for ``target``."""
    from specdec_fast.heads import DFlashHead

    torch.manual_seed(seed)
    head = DFlashHead(dflash_config(target, **kw)).eval()
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, std)
    return head.requires_grad_(False)


def trained_dflash(target, *, key: str, block_size: int = 16, steps: int = 120, rows: int = 512,
                   temperature: float = 0.7, **kw):
    """A DFlash drafter trained on ``rows`` sampled continuations of the target (cached per session)."""
    from specdec_fast.heads import DFlashHead
    from specdec_fast.train import train_dflash

    if key not in _CACHE:
        text = _teacher_text(target, rows, temperature, 2 * block_size)
        head = DFlashHead(dflash_config(target, block_size=block_size, **kw))
        train_dflash(head, target, text, steps=steps, batch_size=16, anchors_per_row=4, lr=3e-3)
        _CACHE[key] = head
    return _CACHE[key]


def dflash2_config(target, *, block_size: int = 8, rank: int = 8, top_k: int = 4, taps: int = 2, group: int = 16,
                   **kw):
    """A DFlash2 config: dflash_config carries the selector and convolution fields as published."""
    config = dflash_config(target, block_size=block_size, **kw)
    config.dflash_config = dict(config.dflash_config, selector_rank=rank, selector_top_k=top_k, conv_kernel_size=taps,
                                conv_group_size=group)
    return config


def random_dflash2(target, *, seed: int = 0, std: float = 0.15, selector_std: float = 1.0, **kw):
    """A DFlash2 drafter with random weights (convolutions and selector included) for ``target``;
    selector_std: the codebooks' and the selector projection's (large enough to move drafts)."""
    from specdec_fast.heads import DFlash2Head

    torch.manual_seed(seed)
    head = DFlash2Head(dflash2_config(target, **kw)).eval()
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("base_kernel"):
                p.add_(torch.randn_like(p) * 0.3)
            elif name.startswith("candidate_selector."):
                p.normal_(0, selector_std)
            elif not name.endswith("norm.weight"):
                p.normal_(0, std)
    return head.requires_grad_(False)



def proposals_per_iteration(drafter, decoder, ids, mask) -> list:
    """decoder.generate(ids, mask) with ``drafter``'s proposals recorded: per iteration, for each
    unfinished row, (the row's text so far, its drafts) as lists of ints."""
    seen, propose = [], drafter.propose

    def recording(k):
        drafts, logits = propose(k)
        st = drafter.state
        seen.append([(st.seq[b, st.start[b]:st.end[b]].tolist(), drafts[b].tolist()) for b in range(ids.shape[0])
                     if not bool(st.finished[b])])
        return drafts, logits

    drafter.propose = recording
    try:
        decoder.generate(ids, mask)
    finally:
        del drafter.propose  # the class's method again
    return seen


def verify_sees_uniform_rows(monkeypatch) -> None:
    """Eagle3Drafter (every head that reads the target's states drafts through it) still draws its drafts from the
    head's rows, but hands the verify uniform rows instead: the sampling tests' control (their tokens then no longer
    follow the target). The engines cached before are released."""
    import specdec_fast
    from specdec_fast.drafters import Eagle3Drafter

    propose = Eagle3Drafter.propose

    def buggy(self, k):
        drafts, logits = propose(self, k)
        return drafts, torch.zeros_like(logits)

    monkeypatch.setattr(Eagle3Drafter, "propose", buggy)
    specdec_fast.release_engines()


def target_weights(target) -> tuple:
    """(input embedding [V, H], lm_head weight [V, H]): what a block drafter shares with its target."""
    return target.get_input_embeddings().weight, target.get_output_embeddings().weight


def check_paged_block_forward(head, runner_cls, target, backend: str, fed: list, device: str = "cpu"):
    """prefill_context over 3 rows (left padding), then a draft call with pending entries
    (num_valid 1, 5, 2) and a block per row; rows with fed[b] == 0 are fed nothing (their outputs are
    unspecified). Each fed row's block outputs equal head.forward over the row's context (float32,
    1e-4), everything on ``device``. Returns the runner."""
    head, target = on_device(device, head, target)
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(3, 6, 192, generator=gen).to(device)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 0, 1]], device=device)
    runner = runner_cls(head, *target_weights(target), num_draft_tokens=4, block_size=4, backend=backend)
    runner.prefill_context(feats, mask, budgets=[20, 20, 20], num_draft_tokens=4)
    pending = torch.randn(3, 5, 192, generator=gen).to(device)
    count = torch.tensor([1, 5, 2], device=device)
    block = torch.full((3, 8), head.mask_token_id, device=device)
    block[:, 0] = torch.tensor([7, 9, 11], device=device)
    out = runner.draft(pending, count, block, torch.tensor(fed, device=device))
    for b in (b for b in range(3) if fed[b]):
        context = torch.cat([feats[b, mask[b].bool()], pending[b, 5 - int(count[b]):]])
        length = context.shape[0]
        with torch.no_grad():
            ref = head(F.embedding(block[b:b + 1], target_weights(target)[0]), head.context(context[None]),
                       torch.arange(length, length + 8, device=device)[None], torch.arange(length, device=device)[None])
        torch.testing.assert_close(out[b], ref[0], atol=1e-4, rtol=1e-4)
    return runner


def reference_block(head, target, context: list) -> torch.Tensor:
    """The block drafter's hidden outputs [1, block_size, H] after context x_0 .. x_c: the block
    [x_c, mask, ...] at positions c .. over the target's hidden states at positions 0 .. c-1."""
    with torch.no_grad():
        states = target(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[j][0, :-1] for j in head.hidden_indices()], -1)
        c = len(context) - 1
        block = torch.full((1, head.block_size), head.mask_token_id)
        block[0, 0] = context[-1]
        return head(F.embedding(block, target_weights(target)[0]), head.context(feats[None]),
                    torch.arange(c, c + head.block_size)[None], torch.arange(c)[None])


def assert_head_drafts_greedy(target, head: str, vocab: int) -> None:
    """An EAGLE-3 head (head "eagle3") or a DFlash block drafter ("dflash"), random, over ``target``: greedy
    generate equals model.generate (the target runner captures the hidden states the head reads)."""
    import specdec_fast

    from .models import left_padded_prompts

    ids, mask = left_padded_prompts([5, 8], vocab=vocab, seed=3)
    kw = dict(do_sample=False, max_new_tokens=12, pad_token_id=0)
    drafter = random_head(target, vocab) if head == "eagle3" else random_dflash(target)
    out = specdec_fast.generate(target, ids, mask, draft_head=drafter, **kw)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, **kw))
    specdec_fast.release_engines(target)


def greedy_under_the_schedule(target, ids, mask, chaos, cycle, **drafting):
    """generate(num_assistant_tokens_schedule="adaptive", greedy, 24 tokens) with the drafting
    keywords twice: under the schedule's own choices, then with K forced through ``cycle`` every
    iteration (tests/engine/conftest.py chaos). Both must equal the target's greedy decoding.
    Returns (stats of the first call, stats of the second, the Ks the second chose)."""
    import specdec_fast

    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0)
    kw = dict(drafting, num_assistant_tokens_schedule="adaptive", do_sample=False, max_new_tokens=24, pad_token_id=0,
              return_stats=True)
    out, own = specdec_fast.generate(target, ids, mask, **kw)
    assert torch.equal(out, expected)
    chosen = chaos(cycle)
    out, forced = specdec_fast.generate(target, ids, mask, **kw)
    assert torch.equal(out, expected)
    return own, forced, chosen
