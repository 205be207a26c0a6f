"""DFlash2 block drafters (heads/dflash2.py, runners/paged_dflash2.py, drafters/block_selector.py):
the paged drafter (in-block convolution, embedding scale) equals the module's reference forward on
every backend; every iteration's drafts are the reference selector walk's over the target's hidden
states (greedy = target greedy, EOS, graphs, the adaptive schedule: test_block_drafters.py); the
published layout (DFlash2DraftModel) round-trips, generate(draft_head=DIR) takes it, malformed
checkpoints fail with one line; sampling follows the target's standardised distribution
(chi-square: temperature, top-k, top-p at K = 4, 8, 15), with a control that hands the verify the
block's logits instead of the selector's distribution (the chi-square test rejects it); a logits
stage that masks every candidate falls back to DFlash's row.

Random drafters (no training: the selector and the convolutions are random, so the drafts differ
from DFlash's; the tiny targets accept some of them). Checkpoints are written by the tests in the
published layout (no hub here)."""
import json

import pytest
import torch
import torch.nn.functional as F

import specdec_fast
from specdec_fast import load_draft_head, save_draft_head
from specdec_fast.drafters import SelectorBlockDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.heads import DFlash2Head
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner
from specdec_fast.runners._linear import linear
from specdec_fast.runners.paged_dflash2 import PagedDFlash2Runner

from tests.conftest import backend_device
from tests.kernels.backends import kernel_backends
from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .heads import check_paged_block_forward, proposals_per_iteration, random_dflash2, reference_block, target_weights
from .models import left_padded_prompts, make_model
from .test_dflash_sampling import PROMPT, VOCAB as SMALL_VOCAB
from .test_sampling_exact import target_probs
from .test_paged_runner import VOCAB, tiny


@pytest.fixture(scope="module")
def target():
    return tiny("llama", layers=4, seed=2)


@pytest.fixture(scope="module")
def drafter(target):
    # random, chosen so that the selector moves most drafts off the block's argmax and some are accepted
    return random_dflash2(target, block_size=16, seed=5, std=0.1, selector_std=0.5, input_embedding_scale=1.5)


def test_fresh_head_is_the_dflash_backbone(target):
    """A fresh DFlash2 head's convolutions are the identity: its forward is DFlash's on the same weights."""
    from specdec_fast.heads import DFlashHead

    from .heads import dflash2_config

    head = DFlash2Head(dflash2_config(target, block_size=8)).eval()
    plain = DFlashHead(head.config).eval()
    plain.load_state_dict({n: t for n, t in head.state_dict().items() if n in plain.state_dict()})
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 8, 64, generator=gen), head.context(torch.randn(2, 5, 192, generator=gen)),
            torch.arange(5, 13)[None].expand(2, -1), torch.arange(5)[None].expand(2, -1))
    with torch.no_grad():
        torch.testing.assert_close(head(*args), plain(*args))


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_paged_drafter_equals_reference_forward(target, backend, device):
    """As test_dflash's: prefill_context (left padding) + a draft call (pending entries, one row fed
    nothing); the block's outputs equal DFlash2Head.forward (3-tap convolutions, embedding scale)."""
    head = random_dflash2(target, block_size=8, seed=4, taps=3, input_embedding_scale=0.7)
    check_paged_block_forward(head, PagedDFlash2Runner, target, backend, fed=[8, 0, 8],
                              device=backend_device(backend, device))


def _reference_drafts(head, target, context: list, k: int) -> list:
    """Greedy drafts after context x_0 .. x_c: the selector's greedy walk from x_c over the reference
    block (and the block's own argmax, DFlash's drafts)."""
    h = reference_block(head, target, context)
    lm_head = target_weights(target)[1]
    with torch.no_grad():
        walk = head.walk(h[:, 1:k + 1], lm_head, torch.tensor([context[-1]]))[0].tolist()
        return walk, F.linear(h[0, 1:k + 1], lm_head).argmax(-1).tolist()


def test_drafts_equal_the_reference_selector_walk(target, drafter):
    k, batch = 6, 2
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=8)
    runner = PagedLlamaRunner(target, max_new_tokens=20, num_draft_tokens=k)
    runner.capture_hidden_states(drafter.hidden_indices())
    block = SelectorBlockDrafter(PagedDFlash2Runner(drafter, *target_weights(target), num_draft_tokens=k), runner)
    decoder = SpeculativeDecoder(runner, block, k=k, params=make_sampling_tensors(batch, "cpu", temperature=0.0, seed=0),
                                 max_new_tokens=20)
    seen = proposals_per_iteration(block, decoder, ids, mask)
    assert len(seen) >= 3 and sum(decoder.stats.result.accepted_hist[1:]) > 0
    moved = 0
    for iteration in seen:
        for context, drafts in iteration:
            walk, argmax = _reference_drafts(drafter, target, context, k)
            assert drafts == walk
            moved += drafts != argmax
    assert moved > 0  # the selector is not a no-op here


def test_layout_round_trip_and_errors(target, drafter, tmp_path):
    from safetensors.torch import load_file, save_file

    save_draft_head(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["block_size"] == 16
    assert config["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [0, 1, 2], "selector_rank": 8,
                                       "selector_top_k": 4, "conv_kernel_size": 2, "conv_group_size": 16}
    weights = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert tuple(weights["candidate_selector.predecessor_codebook"].shape) == (VOCAB, 8)
    assert tuple(weights["candidate_selector.successor_codebook"].shape) == (VOCAB, 8)
    assert tuple(weights["candidate_selector.hidden_projection.weight"].shape) == (8, 64)
    assert tuple(weights["layers.1.attention_conv.base_kernel"].shape) == (2, 2, 64)
    assert tuple(weights["layers.0.mlp_conv.kernel_projection.weight"].shape) == (2 * 2 * 4, 64)
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in weights)  # the target's
    loaded = load_draft_head(tmp_path / "d")
    assert isinstance(loaded, DFlash2Head) and loaded.selector_top_k == 4 and loaded.input_embedding_scale == 1.5
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=1)
    common = dict(num_assistant_tokens=8, do_sample=False, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(specdec_fast.generate(target, ids, mask, draft_head=str(tmp_path / "d"), **common),
                       specdec_fast.generate(target, ids, mask, draft_head=drafter, **common))
    # "model."-prefixed names (vLLM's) load the same
    save_file({f"model.{n}": t for n, t in weights.items()}, str(tmp_path / "d" / "model.safetensors"))
    assert torch.equal(load_draft_head(tmp_path / "d").candidate_selector.successor_codebook,
                       drafter.candidate_selector.successor_codebook)

    def broken(weights=weights, **dflash):
        path = tmp_path / "broken"
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps({**config, "dflash_config": {**config["dflash_config"], **dflash}}))
        save_file(weights, str(path / "model.safetensors"))
        return path

    missing = {n: t for n, t in weights.items() if n != "candidate_selector.successor_codebook"}
    with pytest.raises(ValueError, match=r"DFlash2 weights do not fit the layout: missing \['candidate_selector"
                                         r".successor_codebook'\]"):
        load_draft_head(broken(missing))
    wrong = dict(weights, **{"candidate_selector.predecessor_codebook": torch.zeros(VOCAB, 6)})
    with pytest.raises(ValueError, match=r"DFlash2 weight candidate_selector.predecessor_codebook: shape \(96, 6\), "
                                         r"the config says \(96, 8\)"):
        load_draft_head(broken(wrong))
    with pytest.raises(ValueError, match="needs dflash_config.selector_rank and selector_top_k"):
        load_draft_head(broken(selector_top_k=None))
    with pytest.raises(ValueError, match="conv_group_size 24 must divide hidden_size 64"):
        load_draft_head(broken(conv_group_size=24))
    with pytest.raises(ValueError, match=r"DFlash2 weights do not fit the layout: missing \[\], unexpected "
                                         r"\['layers.0.attention_conv.base_kernel'"):
        load_draft_head(broken(conv_kernel_size=0))  # a checkpoint with convolutions its config does not declare


def test_a_stage_masking_every_candidate_falls_back_to_the_block_row(target, drafter):
    """suppress_tokens bans all but 3 tokens: most positions' 4 candidates are all banned; the drafts
    then come from DFlash's processed row (never a banned token), and the output keeps to the 3."""
    allowed = [5, 9, 17]
    banned = [t for t in range(VOCAB) if t not in allowed]
    ids, mask = left_padded_prompts([5, 3], vocab=VOCAB, seed=4)
    seen, propose = [], SelectorBlockDrafter.propose

    def recording(self, k):
        drafts, logits = propose(self, k)
        seen.append(drafts)
        return drafts, logits

    SelectorBlockDrafter.propose = recording
    try:
        specdec_fast.release_engines()
        out, stats = specdec_fast.generate(target, ids, mask, draft_head=drafter, num_assistant_tokens=8, do_sample=True,
                                           temperature=0.9, suppress_tokens=banned, seed=2, max_new_tokens=12,
                                           pad_token_id=0, return_stats=True)
    finally:
        SelectorBlockDrafter.propose = propose
        specdec_fast.release_engines()
    assert seen and all(torch.isin(d, torch.tensor(allowed)).all() for d in seen)
    assert torch.isin(out[:, ids.shape[1]:], torch.tensor(allowed)).all() and stats.alpha > 0


# -- sampling: chi-square against the target's standardised distribution -------------------------
SAMPLING = {
    "temperature": dict(temperature=0.9, top_k=0, top_p=1.0),
    "top_k": dict(temperature=0.9, top_k=3, top_p=1.0),
    "top_p": dict(temperature=0.9, top_k=0, top_p=0.8),
}


@pytest.fixture(scope="module")
def pair():
    target = make_model("llama", vocab=SMALL_VOCAB, layers=3, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, random_dflash2(target, block_size=16, seed=4, std=0.1, selector_std=0.5)


_EXPECTED = {}


def _expected(target, settings):
    """(joint of tokens 1-2, joint of tokens 2-3) [V*V] after PROMPT under the standardised target.
    Tokens 2 and 3 are the first speculative block's: drafts x_0, x_1 (x_1 drawn given x_0 by the
    selector's walk), their residuals and the bonus."""
    key = (id(target), tuple(sorted(settings.items())))
    if key not in _EXPECTED:
        settings = dict(dict(top_k=0, top_p=1.0, min_p=0.0), **settings)
        vocab, v = torch.arange(SMALL_VOCAB), SMALL_VOCAB
        p1 = target_probs(target, PROMPT, settings)[0]
        p2 = target_probs(target, torch.cat([PROMPT.expand(v, -1), vocab[:, None]], 1), settings)  # [t1, t2]
        grid = torch.cartesian_prod(vocab, vocab)
        p3 = target_probs(target, torch.cat([PROMPT.expand(v * v, -1), grid], 1), settings).view(v, v, v)
        joint = p1[:, None, None] * p2[:, :, None] * p3  # [t1, t2, t3]
        _EXPECTED[key] = joint.sum(2).reshape(-1), joint.sum(0).reshape(-1)
    return _EXPECTED[key]


def _pvalues(target, drafter, backend, k, settings, rows=3000):
    out, stats = specdec_fast.generate(target, PROMPT.expand(rows, -1), draft_head=drafter, num_assistant_tokens=k,
                                       do_sample=True, max_new_tokens=3, seed=123, backend=backend, return_stats=True,
                                       **settings)
    new = out[:, PROMPT.shape[1]:]
    joint12, joint23 = _expected(target, settings)
    return (stats, chi_square_pvalue(new[:, 0] * SMALL_VOCAB + new[:, 1], joint12),
            chi_square_pvalue(new[:, 1] * SMALL_VOCAB + new[:, 2], joint23))


CPU_BACKEND = "cpp" if "cpp" in kernel_backends() else "torch"


@pytest.mark.parametrize("k", [4, 8, 15])
@pytest.mark.parametrize("setting", list(SAMPLING))
def test_sampled_tokens_follow_the_target(pair, setting, k):
    target, drafter = pair
    stats, p12, p23 = _pvalues(target, drafter, CPU_BACKEND, k, SAMPLING[setting])
    # a random drafter (training one takes ~30 s here): ~0.2, some 600 accepts in 3000 rows
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    assert p12 > P_VALUE_THRESHOLD and p23 > P_VALUE_THRESHOLD, (p12, p23)


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SAMPLING))
def test_sampled_tokens_follow_the_target_torch_backend(pair, setting):
    target, drafter = pair
    stats, p12, p23 = _pvalues(target, drafter, "torch", 8, SAMPLING[setting])
    assert p12 > P_VALUE_THRESHOLD and p23 > P_VALUE_THRESHOLD, (p12, p23)


@pytest.mark.parametrize("setting", list(SAMPLING))
def test_control_block_logits_as_q_fails(pair, setting, monkeypatch):
    """The verify gets the block's logits (DFlash's q) while the drafts come from the selector's walk."""
    target, drafter = pair
    run_block, propose = SelectorBlockDrafter._run_block, SelectorBlockDrafter.propose

    def keeping(self):
        self._h = run_block(self)
        return self._h

    def wrong_q(self, k):
        drafts, _ = propose(self, k)
        return drafts, linear(self._h[:, 1:k + 1], self.runner.lm_head)

    monkeypatch.setattr(SelectorBlockDrafter, "_run_block", keeping)
    monkeypatch.setattr(SelectorBlockDrafter, "propose", wrong_q)
    specdec_fast.release_engines()
    _, p12, p23 = _pvalues(target, drafter, CPU_BACKEND, 4, SAMPLING[setting])
    specdec_fast.release_engines()
    assert min(p12, p23) < P_VALUE_THRESHOLD, (p12, p23)


def test_training_updates_the_selector_and_the_convolutions(pair):
    """train_dflash on a DFlash2 head: the backbone loss plus the selector's CE (train/dflash.py)
    move the codebooks, the selector projection and the convolutions (a smoke test: 8 steps)."""
    from specdec_fast.train import train_dflash
    from specdec_fast.train.dflash import dflash_loss, selector_loss  # noqa: F401 (the public pieces)

    from .heads import dflash2_config

    target = pair[0]
    torch.manual_seed(0)
    head = DFlash2Head(dflash2_config(target, block_size=4))
    before = {n: p.detach().clone() for n, p in head.named_parameters()}
    text = torch.randint(3, SMALL_VOCAB, (16, 12), generator=torch.Generator().manual_seed(0))
    report = train_dflash(head, target, text, steps=8, batch_size=4, anchors_per_row=2, lr=1e-2)
    assert torch.isfinite(torch.tensor(report["final_loss"]))
    for name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                 "candidate_selector.hidden_projection.weight", "layers.0.attention_conv.kernel_projection.weight",
                 "layers.1.mlp_conv.base_kernel"):
        assert not torch.equal(before[name], dict(head.named_parameters())[name]), name


def test_the_stage_processes_each_draft_position_once(target, drafter):
    """With a logits stage (here a user's logits processor), each drafted position goes through the
    stage once (a stateful processor must not see a position twice), K calls per proposal."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Counting(LogitsProcessor):
        calls = 0

        def __call__(self, input_ids, scores):
            Counting.calls += 1
            return scores

    ids, mask = left_padded_prompts([5, 3], vocab=VOCAB, seed=4)
    per_proposal, propose, process = [], SelectorBlockDrafter.propose, SelectorBlockDrafter._process

    def counting_process(self, row, tokens):
        per_proposal[-1] += 1
        return process(self, row, tokens)

    def recording(self, k):
        per_proposal.append(0)
        return propose(self, k)

    SelectorBlockDrafter.propose, SelectorBlockDrafter._process = recording, counting_process
    try:
        specdec_fast.release_engines()
        specdec_fast.generate(target, ids, mask, draft_head=drafter, num_assistant_tokens=6, do_sample=True,
                              temperature=0.9, seed=1, max_new_tokens=10, pad_token_id=0,
                              logits_processor=LogitsProcessorList([Counting()]))
    finally:
        SelectorBlockDrafter.propose, SelectorBlockDrafter._process = propose, process
        specdec_fast.release_engines()
    assert per_proposal and all(n == 6 for n in per_proposal), per_proposal
    assert Counting.calls > 0
