"""End to end against model.generate itself: its raw logits per step (output_logits), cut into
speculative iterations (row b at gen_len g_b scores N positions whose drafts are the tokens that
generate produced next), processed by LogitsProcessing.process (the warpers when sampling, the
watermark last), equal its ``scores`` (output_scores) at every position: the options exactly as
generate resolves them (min_new_tokens -> min_length, the pads that repetition_penalty skips,
begin_index), with the combinations a chat template uses."""
import pytest
import torch
from transformers.generation import WatermarkingConfig

from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.processing import LogitsProcessing
from specdec_fast.processing.penalties import generate_skips_prompt_pads

from ..engine.models import left_padded_prompts, make_model
from .cases import assert_same

VOCAB, EOS, N, NEW = 96, 2, 4, 14

CHAT = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=6, suppress_tokens=[5, 7])
OPTIONS = {
    "chat": CHAT,
    "chat+bias+bad": dict(CHAT, sequence_bias=[[[11], 1.5], [[12, 13], 2.0]], bad_words_ids=[[20], [21, 22]],
                          begin_suppress_tokens=[30, 31], min_length=4),
    "ngram1+min_length": dict(no_repeat_ngram_size=1, min_length=9),
    "encoder+chat": dict(CHAT, encoder_repetition_penalty=1.7, encoder_no_repeat_ngram_size=1),
}
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.95, min_p=0.02, typical_p=0.9,
                epsilon_cutoff=3e-4, eta_cutoff=1e-3)
# every warper transformers has: top_h between the temperature and top_k
# (and the watermark, after them all)
WARPERS = {False: dict(do_sample=False), True: SAMPLING, "top_h": dict(SAMPLING, top_h=0.7),
           "watermark": dict(do_sample=False, watermarking_config=WatermarkingConfig(bias=2.0, context_width=2)),
           "top_h+watermark": dict(SAMPLING, top_h=0.7,
                                   watermarking_config=WatermarkingConfig(seeding_scheme="selfhash"))}


@pytest.fixture(scope="module")
def model():
    return make_model("llama", vocab=VOCAB, layers=1, seed=3, init_std=0.3)


def generate(model, ids, mask, options, sampling):
    torch.manual_seed(0)
    kw = WARPERS[sampling]
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=EOS, pad_token_id=0,
                         output_scores=True, output_logits=True, return_dict_in_generate=True, **options, **kw)
    return out.sequences, torch.stack(out.logits, 1), torch.stack(out.scores, 1)  # [B, P + S], [B, S, V] x2


@pytest.mark.parametrize("name,sampling", [("chat", False), ("chat", True), ("chat+bias+bad", False),
                                           ("chat+bias+bad", True), ("ngram1+min_length", False),
                                           ("chat", "top_h"), ("chat", "watermark"), ("encoder+chat", False),
                                           ("encoder+chat", True),
                                           ("chat+bias+bad", "top_h+watermark")])
def test_processed_logits_equal_generate_scores(model, name, sampling):
    ids, mask = left_padded_prompts([7, 4, 2], vocab=VOCAB, seed=len(name))
    options = OPTIONS[name]
    sequences, raw, scores = generate(model, ids, mask, options, sampling)
    batch, width = ids.shape
    steps = raw.shape[1]
    warpers = WARPERS[sampling] if sampling else {}
    processing = LogitsProcessing.from_options(dict(options, eos_token_id=EOS, **warpers),
                                               vocab_size=VOCAB, prompt_width=width, device="cpu",
                                               fused_penalties=False)
    start = width - mask.sum(1)
    params = make_sampling_tensors(batch, "cpu", temperature=0.8, top_k=40, top_p=0.95, min_p=0.02)
    seq = torch.cat([sequences, torch.zeros(batch, N, dtype=torch.long)], 1)  # slack past the last step
    checked = 0
    for first in range(0, steps, N - 1):
        gen_len = (first + torch.arange(batch)).clamp(max=steps - 1)  # rows at different lengths
        pos = (gen_len[:, None] + torch.arange(N)).clamp(max=steps - 1)  # [B, N] step of each position
        logits = raw[torch.arange(batch)[:, None], pos].clone()
        end = width + gen_len
        drafts = seq[torch.arange(batch)[:, None], end[:, None] + torch.arange(N - 1)]
        # pads: skipped or counted as the installed generate() does (engine/logits_stage.py follows it)
        ours = processing.process(logits, seq, end, drafts, start=start if generate_skips_prompt_pads() else None,
                                  params=params)
        assert processing.warpers_here == bool(WARPERS[sampling]["do_sample"])  # standardised in process
        valid = gen_len[:, None] + torch.arange(N) < steps
        assert_same(ours, scores[torch.arange(batch)[:, None], pos], valid)
        checked += int(valid.sum())
    assert checked >= batch * steps
    if not WARPERS[sampling]["do_sample"]:  # the greedy tokens: the argmax of these scores (until EOS: pads after)
        generated = sequences[:, width:]
        live = torch.cat([torch.ones(batch, 1, dtype=torch.bool), (generated != EOS).cumprod(1)[:, :-1].bool()], 1)
        assert torch.equal(scores.argmax(-1)[live], generated[live])
