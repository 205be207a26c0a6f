"""PagedOlmo2Runner: OLMo 2's layer (q / k norms over the whole projection, norms after each
branch, float32 RoPE tables, its RMSNorm's float32 weight product) and OLMo 3's (sliding layers,
a RoPE per layer type) give the model's own logits on every backend, and greedy
generate(runner="paged") equals model.generate token for token."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.runners.paged_olmo2 import PagedOlmo2Runner
from specdec_fast.runners.registry import paged_runner_class

from .models import left_padded_prompts, make_draft
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward
from ..conftest import backend_device

VOCAB = 96


def tiny_olmo2(seed: int = 0, layers: int = 2, kind: str = "olmo2"):
    """A random OLMo 2 (kind "olmo2") or OLMo 3 ("olmo3": layers alternating sliding_attention (a
    window of 200, which the tests' rows stay inside) and full_attention, whose RoPE is another:
    linear scaling, another theta)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "olmo2":
        config = tf.Olmo2Config(rope_parameters={"rope_type": "default", "rope_theta": 700.0}, **common)
    else:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        config = tf.Olmo3Config(layer_types=types, sliding_window=200, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 900.0}}, **common)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    with torch.no_grad():  # norms that are not all ones, so their placement and their weights are tested
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
@pytest.mark.parametrize("kind", ["olmo2", "olmo3"])
def test_logits_equal_hf_forward(kind, backend, device):
    device = backend_device(backend, device)
    model = tiny_olmo2(kind=kind).to(device)
    assert paged_runner_class(model) is PagedOlmo2Runner
    runner = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert_runner_matches_forward(model, runner, VOCAB)


def test_bfloat16_close_to_hf_forward():
    model = tiny_olmo2().to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedOlmo2Runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["olmo2", "olmo3"])
def test_greedy_paged_equals_generate(kind, batch):
    target = tiny_olmo2(seed=5, kind=kind)
    draft = make_draft(target, noise=0.03)
    ids, mask = left_padded_prompts([6] if batch == 1 else [4, 10, 7], vocab=VOCAB, seed=batch)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    for drafting in (dict(assistant_model=draft, num_assistant_tokens=3), dict(prompt_lookup_num_tokens=2), {}):
        out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=20, pad_token_id=0, runner="paged",
                           **drafting)
        assert torch.equal(out, expected), drafting


def test_the_norms_weigh_in_float32():
    """The control of the norm the runner uses: in bfloat16, multiplying by the weight after the
    cast (Llama's RMSNorm) rounds differently from OLMo 2's float32 product, which is the model's."""
    from specdec_fast.runners.paged_olmo2 import olmo_rms_norm

    model = tiny_olmo2().to(torch.bfloat16)
    norm = model.model.layers[0].post_attention_layernorm
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ours = olmo_rms_norm(x, (norm.weight, norm.variance_epsilon))
    assert torch.equal(ours, norm(x))
    x32 = x.float()
    llama_style = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).to(x.dtype)
    assert not torch.equal(llama_style, norm(x))


def test_olmo3_takes_each_layer_type_s_rope():
    """The control of OLMo 3's per-type RoPE: its two tables differ, and a runner that rotates
    every layer with the sliding layers' table no longer gives the model's logits; rows past the
    sliding window go to the hf runner."""
    model = tiny_olmo2(kind="olmo3")
    runner = PagedOlmo2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.rope_keys == ["sliding_attention", "full_attention"]
    sliding, full = runner.rope_tables["sliding_attention"], runner.rope_tables["full_attention"]
    assert not torch.equal(sliding[0], full[0])
    runner.rope_keys = ["sliding_attention"] * 2
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
    assert api.choose_runner(model, None, 150) == "paged"
    assert api.choose_runner(model, None, 250) == "hf"
