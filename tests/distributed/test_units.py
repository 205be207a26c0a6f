"""The pieces of tensor parallelism that need no second process: the shard plan (divisibility
errors, KV-head replication, slices that tile every tensor), reading a checkpoint slice by slice
(no whole tensor read), the lockstep polls (the stop iteration independent of the device's
timing), the failure channel, and the errors raised before any group exists."""
import datetime

import pytest
import torch
import torch.distributed as dist

import specdec_fast
from specdec_fast.distributed.failures import FailureChannel, describe
from specdec_fast.drafters import ModelDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.engine.run_ahead import RunAheadPoller
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner
from specdec_fast.runners._moe import is_moe
from specdec_fast.runners.paged_llama import mlp_of
from specdec_fast.runners.sharding import LlamaShardPlan, shards_from_safetensors, shards_from_state

from ..engine.conftest import model_pair
from ..engine.models import exaone_original_checkpoint, left_padded_prompts, llama4_multimodal_checkpoint, make_model
from ..fake_cuda import LateDevice
from .checkpoint_checks import assert_reads_as_the_model


class _Config:
    def __init__(self, heads=8, kv_heads=2, hidden=64, intermediate=96, vocab=128):
        self.num_attention_heads, self.num_key_value_heads, self.hidden_size = heads, kv_heads, hidden
        self.intermediate_size, self.vocab_size, self.head_dim = intermediate, vocab, hidden // heads


@pytest.mark.parametrize("sizes, world, message", [
    (dict(heads=6), 4, "num_attention_heads 6 is not divisible by 4"),
    (dict(kv_heads=3, heads=12), 2, "num_key_value_heads 3 neither divides nor is divisible by 2"),
    (dict(intermediate=90), 4, "intermediate_size 90 is not divisible by 4"),
    (dict(vocab=130), 4, "vocab_size 130 is not divisible by 4"),
])
def test_plan_refuses_what_does_not_divide(sizes, world, message):
    with pytest.raises(ValueError, match=f"tensor parallelism over {world} ranks: {message}"):
        LlamaShardPlan.for_config(_Config(**sizes), world, 0)


def test_plan_kv_heads_split_or_replicated():
    # 2 KV heads over 4 ranks: replicated, rank r holds head r * 2 // 4 (its query heads' group).
    plans = [LlamaShardPlan.for_config(_Config(heads=8, kv_heads=2), 4, r) for r in range(4)]
    assert [p.kv_start for p in plans] == [0, 0, 1, 1] and all(p.local_kv_heads == 1 for p in plans)
    assert all(p.kv_replicated and p.local_heads == 2 for p in plans)
    assert "KV heads replicated (2 over 4 ranks: head 1 here)" in plans[3].describe()
    # 8 KV heads over 2 ranks: split, 4 each.
    plans = [LlamaShardPlan.for_config(_Config(heads=8, kv_heads=8), 2, r) for r in range(2)]
    assert [p.kv_start for p in plans] == [0, 4] and not plans[0].kv_replicated and plans[1].local_kv_heads == 4
    # Every query head of a rank reads the rank's KV head: global kv of local q i = kv_start + i // group.
    for world, kv in ((4, 2), (2, 2), (4, 4), (8, 2)):
        for rank in range(world):
            p = LlamaShardPlan.for_config(_Config(heads=8, kv_heads=kv), world, rank)
            local_group = p.local_heads // p.local_kv_heads
            for i in range(p.local_heads):
                assert (rank * p.local_heads + i) // (8 // kv) == p.kv_start + i // local_group


@pytest.mark.parametrize("kind, world", [("llama", 2), ("qwen2", 2), ("qwen2", 4), ("cohere_qk", 2), ("cohere2", 2),
                                         ("phi3", 2), ("starcoder2", 2)])
def test_shards_tile_every_tensor(kind, world):
    """Column / vocab slices concatenated over the ranks (dim 0), row-parallel ones (dim 1), give the
    whole tensor back; replicated ones are whole on every rank (KV heads replicated at 4 ranks)."""
    model = make_model(kind)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, world, r) for r in range(world)]
    shards = [shards_from_state(state, p) for p in plans]
    for name, full in state.items():
        part = plans[0].slice_of(name)
        parts = [s[name] for s in shards]
        if part is None:
            assert all(torch.equal(p, full) for p in parts), name
        elif isinstance(part, tuple):  # Phi-3's fused rows: each part's rows of every rank, part after part
            sizes = [c.stop - c.start for c in part]
            pieces = [torch.split(p, sizes, dim=part[0].dim) for p in parts]
            assert torch.equal(torch.cat([pieces[r][c] for c in range(len(part)) for r in range(world)], part[0].dim),
                               full), name
        elif "k_proj" in name or "v_proj" in name and plans[0].kv_replicated:
            heads = [p.kv_start for p in plans]
            assert all(torch.equal(parts[r], full.narrow(0, heads[r] * plans[0].head_dim, parts[r].shape[0]))
                       for r in range(world)), name
        else:
            assert torch.equal(torch.cat(parts, part.dim), full), name
        assert all(p.is_contiguous() for p in parts)


MOE_KINDS = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "exaone_moe", "solar_open", "llama4_text",
             "hunyuan_v1_moe", "hy_v3", "afmoe", "granitemoe", "kolibri1", "flint", "flex_olmo")


def _moe_partials(model, shards_per_rank, layer: int, h, triton=False):
    """Each rank's MoE block output for h [T, H] from its shards (runners/_moe.MoE over its slice of
    every expert; triton: through kernels/moe), and transformers' block output."""
    from specdec_fast.runners.sharding_moe import layer_moe

    prefix = f"model.layers.{layer}."
    partials = [layer_moe(shards, prefix, rank == 0, model.config, "triton" if triton else "torch")(h)
                for rank, shards in enumerate(shards_per_rank)]
    theirs = mlp_of(model.model.layers[layer])(h[None])
    return partials, (theirs[0] if isinstance(theirs, tuple) else theirs).reshape(h.shape)  # Llama 4's: [T, H]


@pytest.mark.parametrize("world, triton", [(2, False), (4, False), (2, True)])
@pytest.mark.parametrize("kind", MOE_KINDS + ("cohere2_moe",))  # (Cohere 2 MoE: tied, its checkpoint has no lm_head)
def test_moe_partials_sum_to_the_block(kind, world, triton):
    """Every expert split by its width over the ranks, the router replicated: the ranks' block
    outputs sum to transformers' block (Qwen2-MoE's shared expert and GLM-4.5's shared MLP split
    too, GPT-OSS's interleaved gate / up columns and biases, its down bias added by rank 0 only,
    GLM-4.5's router bias replicated, Llama 4's [E, H, 2I] gate | up columns and its shared expert, the
    router's weight scaling each rank's slice of the expert's input alike), on the torch products and
    through kernels/moe (7 tokens: its expert schedule; interpreted here); a rank's own part is not
    the block (the control)."""
    if triton:
        pytest.importorskip("triton")
    model = make_model(kind)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.3)
        for name, buffer in model.named_buffers():  # GLM-4.5's router bias (replicated)
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.5)
    layer = next(i for i, block in enumerate(model.model.layers) if is_moe(mlp_of(block)))  # GLM-4.5: layer 0 is dense
    plans = [LlamaShardPlan.for_config(model.config, world, r) for r in range(world)]
    shards = [shards_from_state(model.state_dict(), p) for p in plans]
    inter = plans[0].expert_intermediate // world
    gate_up = shards[1][f"model.layers.{layer}.mlp.experts.gate_up_proj"]
    assert gate_up.shape[2 if kind in ("gpt_oss", "llama4_text") else 1] == 2 * inter and gate_up.is_contiguous()
    h = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(world))
    with torch.no_grad():
        partials, theirs = _moe_partials(model, shards, layer, h, triton)
    torch.testing.assert_close(sum(partials), theirs, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(partials[0], theirs, atol=1e-3)


def test_afmoe_splits_its_output_gate_as_q_and_reads_its_router_renamed():
    """AFMoE's self_attn.gate_proj (a row per query channel) is split as q_proj is, so each rank gates its own heads;
    its router (router.gate) and correction bias (the block's expert_bias) are whole on every rank under the names
    runners/_moe.MoE reads."""
    model = make_model("afmoe")
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    for i in range(2):
        prefix = f"model.layers.{i}.self_attn."
        assert plans[0].slice_of(prefix + "gate_proj.weight") == plans[0].slice_of(prefix + "q_proj.weight")
        assert torch.equal(torch.cat([s[prefix + "gate_proj.weight"] for s in shards]), state[prefix + "gate_proj.weight"])
    for s in shards:
        assert torch.equal(s["model.layers.1.mlp.gate.weight"], state["model.layers.1.mlp.router.gate.weight"])
        assert torch.equal(s["model.layers.1.mlp.gate.e_score_correction_bias"], state["model.layers.1.mlp.expert_bias"])
        assert "model.layers.1.mlp.router.gate.weight" not in s and "model.layers.1.mlp.expert_bias" not in s


def test_moe_plan_refuses_experts_that_do_not_divide():
    config = make_model("qwen3_moe").config
    config.moe_intermediate_size = 30
    with pytest.raises(ValueError, match="tensor parallelism over 4 ranks: the experts' width 30 is not divisible by 4"):
        LlamaShardPlan.for_config(config, 4, 0)
    config = make_model("qwen2_moe").config
    config.shared_expert_intermediate_size = 50
    with pytest.raises(ValueError, match="the shared MLP's width 50 is not divisible by 4"):
        LlamaShardPlan.for_config(config, 4, 0)


class _Recording:
    """safetensors.safe_open stand-in that records which read each tensor took."""

    calls = []

    def __init__(self, real):
        self.real = real

    def __enter__(self):
        self.handle = self.real.__enter__()
        return self

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name):
        _Recording.calls.append(("get_slice", name))
        return self.handle.get_slice(name)

    def get_tensor(self, name):
        _Recording.calls.append(("get_tensor", name))
        return self.handle.get_tensor(name)


@pytest.mark.parametrize("kind", ("qwen2",) + MOE_KINDS)
def test_checkpoint_read_slice_by_slice(kind, tmp_path, monkeypatch):
    """Every tensor read as a slice (never whole) gives a loaded model's shards, in each checkpoint
    layout: dense Qwen2; the MoE experts per expert (Qwen's gate_proj / up_proj / down_proj,
    Mixtral's w1 / w3 / w2 under block_sparse_moe) or 3-D (GPT-OSS), gathered into the 3-D names."""
    import safetensors

    model = make_model(kind)
    model.save_pretrained(tmp_path)
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: _Recording(real(*a, **k)))
    _Recording.calls = []
    for rank in range(2):
        read = assert_reads_as_the_model(tmp_path, model, 2, rank)
        assert read["model.layers.1.self_attn.o_proj.weight"].shape == (48, 24)
    assert _Recording.calls and all(kind == "get_slice" for kind, _ in _Recording.calls)


def test_a_sparse_attention_checkpoint_reads_its_indexers_whole(tmp_path, monkeypatch):
    """GLM-5's (and DeepSeek-V3.2's) DeepSeek Sparse Attention indexers are read whole on every rank (each rank
    chooses the same keys for its heads: paged_mla_tp.py), every tensor as a slice, giving a loaded model's shards."""
    import safetensors

    model = make_model("glm_moe_dsa")
    model.save_pretrained(tmp_path)
    state = model.state_dict()
    indexer = {name for name in state if ".self_attn.indexer." in name}
    assert indexer  # layer 0's (layer 1 reuses its choice)
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: _Recording(real(*a, **k)))
    _Recording.calls = []
    read = assert_reads_as_the_model(tmp_path, model, 2, 1)
    assert all(torch.equal(read[name], state[name]) for name in indexer)
    assert all(kind == "get_slice" for kind, _ in _Recording.calls)


def test_checkpoint_layers_past_the_config_are_not_read(tmp_path, monkeypatch):
    """GLM-4.5 / DeepSeek-V3 checkpoints hold a multi-token prediction layer after the decoder's
    (model.layers.{num_hidden_layers}.*, ignored by transformers): a rank does not read it."""
    import safetensors
    from safetensors.torch import load_file, save_file

    model = make_model("qwen2")  # 2 layers
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    extra = {"model.layers.2.eh_proj.weight": torch.ones(48, 96),
             "model.layers.2.mlp.experts.0.gate_proj.weight": torch.ones(4, 48)}
    save_file({**state, **extra}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: _Recording(real(*a, **k)))
    _Recording.calls = []
    read = shards_from_safetensors(str(tmp_path), LlamaShardPlan.for_config(model.config, 2, 0))
    assert not any(name.startswith("model.layers.2.") for name in read)
    assert {name for _, name in _Recording.calls} == set(state)  # every other tensor read, these not


def test_a_multimodal_llama4_checkpoint_reads_its_text_decoder(tmp_path, monkeypatch):
    """Meta's layout (llama4_multimodal_checkpoint): each rank reads the decoder's tensors as slices, under the
    names of a loaded Llama4ForCausalLM's shards (language_model. dropped, feed_forward read as mlp), and never
    the vision tower or the projector."""
    import safetensors

    model = make_model("llama4_text")
    llama4_multimodal_checkpoint(model, tmp_path)
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: _Recording(real(*a, **k)))
    _Recording.calls = []
    read = assert_reads_as_the_model(tmp_path, model, 2, 1)
    assert "model.layers.1.mlp.experts.gate_up_proj" in read
    assert read["model.layers.0.mlp.gate_proj.weight"].shape == (48, 48)  # layer 0's dense MLP: 48 of 96 rows
    assert read["model.layers.1.mlp.shared_expert.gate_proj.weight"].shape == (12, 48)  # 12 of the expert's 24
    assert not any(name.startswith(("vision_model.", "multi_modal_projector.")) for _, name in _Recording.calls)


def test_an_exaone_checkpoint_reads_under_transformers_names(tmp_path):
    """EXAONE 3.x as LG publishes it (transformer.h.N.attn.attention.*, c_fc_0 / c_fc_1 / c_proj): each rank's
    slices under the names transformers renames them to, equal to a loaded model's shards; the transformer.h.
    names under another family's plan are not renamed (the control)."""
    model = make_model("exaone")
    exaone_original_checkpoint(model, tmp_path)
    read = assert_reads_as_the_model(tmp_path, model, 2, 1)
    assert read["model.layers.1.self_attn.o_proj.weight"].shape == (48, 24)
    other = LlamaShardPlan.for_config(make_model("llama").config, 2, 1)
    assert other.layout_name("transformer.h.0.attn.attention.q_proj.weight") == "transformer.h.0.attn.attention.q_proj.weight"


def _lockstep_decode(lag: int, lockstep: bool):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 8], seed=2)
    runner = PagedLlamaRunner(target, max_new_tokens=20, num_draft_tokens=3)
    runner.lockstep_polls = lockstep  # what the tensor-parallel runner declares
    decoder = SpeculativeDecoder(runner, ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=20, num_draft_tokens=3)), k=3,
                                 params=make_sampling_tensors(2, "cpu", temperature=0.0, seed=0), max_new_tokens=20,
                                 pad_token_id=0, run_ahead=2)
    device = LateDevice(lag)
    decoder.use_events(device.Event)
    step = decoder.step

    def late_step():
        device.tick()
        step()

    decoder.step = late_step
    out = decoder.generate(ids, mask)
    return out, decoder.stats.result.iterations


def test_lockstep_polls_stop_at_the_same_iteration_whatever_the_timing():
    """Ranks of a group must run the same iterations; without lockstep the stop depends on which
    polls happen to have completed (the lag), with it only on the iterations."""
    runs = {lag: _lockstep_decode(lag, True) for lag in (0, 1, 3, 1000)}
    assert len({iterations for _, iterations in runs.values()}) == 1
    assert all(torch.equal(out, runs[0][0]) for out, _ in runs.values())
    free = {lag: _lockstep_decode(lag, False)[1] for lag in (0, 1000)}
    assert free[0] < free[1000], "the test needs a case where timing changes the opportunistic stop"
    assert runs[0][1] == free[1000], "lockstep stops where the slowest device would (R - 1 extra iterations)"


def test_lockstep_changes_nothing_without_events():
    status = torch.tensor([[1], [0]])
    for lockstep in (False, True):
        poller = RunAheadPoller(status, 2, events=None, lockstep=lockstep)
        poller.issue(0)
        poller.issue(1)
        assert poller.wait(1).done and poller.read == 0  # CPU: every poll complete, read at once


def test_failure_channel_keeps_the_first_line():
    store = dist.HashStore()
    channel = FailureChannel(store, "x", rank=1, size=4)
    assert channel.first(0.0) is None
    channel.publish(ValueError("bad input\nmore detail"))
    FailureChannel(store, "x", rank=2, size=4).publish(RuntimeError("a consequence"))
    assert channel.first(0.0) == "rank 1 of 4 failed: ValueError: bad input"
    assert describe(KeyError()) == "KeyError"


def test_errors_before_any_group():
    target, draft = model_pair("llama")
    with pytest.raises(ValueError, match="shard_draft=True needs process_group"):
        specdec_fast.SpeculativeEngine(target, draft, shard_draft=True)
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="needs torch.distributed initialised"):
            specdec_fast.SpeculativeEngine(target, draft, process_group=object(), tp_timeout=datetime.timedelta(seconds=5))
    with pytest.raises(ValueError, match="runner='hf' cannot be sharded|needs torch.distributed"):
        specdec_fast.generate(target, torch.tensor([[3, 4]]), process_group=object(), runner="hf", max_new_tokens=2)


def test_tensor_parallel_graphs_are_opt_in():
    """NCCL inside CUDA graphs was not run on a multi-GPU machine: the TP runner decodes eagerly
    unless cuda_graphs=True (checked on the policy alone: no GPU here)."""
    from specdec_fast.engine.graph_policy import resolve_graph_mode
    from specdec_fast.runners import TPPagedLlamaRunner

    class Runner:
        graph_safe, backend = True, None
        graphs_by_default, graphs_note = TPPagedLlamaRunner.graphs_by_default, TPPagedLlamaRunner.graphs_note

    cuda = torch.device("cuda")
    mode, note = resolve_graph_mode(None, Runner(), None, None, cuda)
    assert mode == "eager" and "pass cuda_graphs=True" in note
    assert resolve_graph_mode(True, Runner(), None, None, cuda) == ("cuda_graphs", None)
    assert resolve_graph_mode("static", Runner(), None, None, torch.device("cpu"))[0] == "static"


def test_what_a_tensor_parallel_call_refuses():
    """Nothing a rank decides from its own clock may steer the loop: max_time (or a MaxTimeCriteria)
    is refused before any collective; the same options pass without tensor parallelism's check."""
    from transformers.generation.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

    from specdec_fast.engine.stopping import call_limits
    from specdec_fast.engine.tensor_parallel import check_tp_call
    from specdec_fast.options import resolve_options

    target = make_model("llama")
    for extra in (dict(max_time=5.0), dict(stopping_criteria=StoppingCriteriaList([MaxTimeCriteria(5.0)]))):
        opts = resolve_options(target, None, dict(max_new_tokens=4, **extra), 3)
        with pytest.raises(ValueError, match="max_time .* with tensor parallelism"):
            check_tp_call(target, opts, call_limits(opts, 3, None))
    opts = resolve_options(target, None, dict(max_new_tokens=4, repetition_penalty=1.1), 3)
    check_tp_call(target, opts, call_limits(opts, 3, None))  # a token-only option: fine


@pytest.mark.parametrize("name", ["output_scores", "output_logits", "output_hidden_states", "output_attentions"])
def test_a_sharded_target_refuses_the_outputs_that_need_its_forward(name):
    """A ShardedCausalLM has no forward: the output dict's scores, logits, hidden states and
    attentions are refused before the loop, naming the option; without return_dict_in_generate
    transformers returns the tokens alone, so the option changes nothing and passes."""
    from specdec_fast.engine.stopping import call_limits
    from specdec_fast.engine.tensor_parallel import check_tp_call
    from specdec_fast.options import resolve_options
    from specdec_fast.runners.sharded_model import ShardedCausalLM

    config_source = make_model("llama")
    sharded = ShardedCausalLM.__new__(ShardedCausalLM)  # only its type is read here
    opts = resolve_options(config_source, None, dict(max_new_tokens=4, return_dict_in_generate=True, **{name: True}), 3)
    with pytest.raises(ValueError, match=f"{name} need the target's own forward"):
        check_tp_call(sharded, opts, call_limits(opts, 3, None))
    opts = resolve_options(config_source, None, dict(max_new_tokens=4, **{name: True}), 3)
    check_tp_call(sharded, opts, call_limits(opts, 3, None))


def test_a_sharded_target_refuses_a_user_cache():
    """A user's cache is extended by the target's own forward (engine/user_cache.py), which a
    ShardedCausalLM does not have: refused before the loop; a whole target passes."""
    from transformers import DynamicCache

    from specdec_fast.engine.stopping import call_limits
    from specdec_fast.engine.tensor_parallel import check_tp_call
    from specdec_fast.options import resolve_options
    from specdec_fast.runners.sharded_model import ShardedCausalLM

    whole = make_model("llama")
    sharded = ShardedCausalLM.__new__(ShardedCausalLM)  # only its type is read here
    opts = resolve_options(whole, None, dict(max_new_tokens=4), 3)
    with pytest.raises(ValueError, match="cache= / past_key_values= needs the target's own forward"):
        check_tp_call(sharded, opts, call_limits(opts, 3, None), DynamicCache())
    check_tp_call(whole, opts, call_limits(opts, 3, None), DynamicCache())


def test_a_sharded_target_refuses_guidance():
    """guidance_scale runs the target's own forward on its unconditional stream, which a
    ShardedCausalLM does not have: refused before the loop; a whole target passes."""
    from specdec_fast.engine.stopping import call_limits
    from specdec_fast.engine.tensor_parallel import check_tp_call
    from specdec_fast.options import resolve_options
    from specdec_fast.runners.sharded_model import ShardedCausalLM

    whole = make_model("llama")
    sharded = ShardedCausalLM.__new__(ShardedCausalLM)  # only its type is read here
    opts = resolve_options(whole, None, dict(max_new_tokens=4, guidance_scale=1.5), 3)
    with pytest.raises(ValueError, match="guidance_scale needs the target's own forward"):
        check_tp_call(sharded, opts, call_limits(opts, 3, None))
    check_tp_call(whole, opts, call_limits(opts, 3, None))


def test_the_ranks_compare_user_objects_without_their_addresses():
    """Each rank builds its own stopping criteria, logits processors and prefix function: the
    request's facts hold their types and texts, not their memory addresses (the tensor-parallel
    fuzzing round found every such call refused as a disagreement). Different code still differs."""
    from transformers import LogitsProcessorList, StoppingCriteriaList
    from transformers.generation.stopping_criteria import StoppingCriteria

    from specdec_fast.engine.tensor_parallel import options_text, request_facts
    from specdec_fast.options import resolve_options

    class StopOn(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 5

    target = make_model("llama")
    ids, mask = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)

    def call(**options):
        opts = resolve_options(target, None, dict(max_new_tokens=4, **options), 3)
        return request_facts(ids, mask, opts, 2, None, 7)

    for make in (lambda: dict(stopping_criteria=StoppingCriteriaList([StopOn()])),
                 lambda: dict(logits_processor=LogitsProcessorList([lambda i, s: s])),
                 lambda: dict(prefix_allowed_tokens_fn=lambda b, i: [1, 2])):
        first, second = make(), make()  # two objects, as two ranks hold
        assert repr(first) != repr(second)  # the addresses differ
        assert call(**first) == call(**second)
    assert call(repetition_penalty=1.2) != call(repetition_penalty=1.3)
    assert " at 0x" not in options_text(resolve_options(target, None, dict(
        max_new_tokens=4, logits_processor=LogitsProcessorList([lambda i, s: s])), 3))


def _k_ranks(store, timeout_s=2.0):
    """Rank 0 and rank 1 of a group of two as LeaderK sees it (its failure channel in ``store``)."""
    from types import SimpleNamespace

    return [SimpleNamespace(rank=rank, timeout=datetime.timedelta(seconds=timeout_s),
                            failures=FailureChannel(store, "specdec_fast/tp/test", rank, 2)) for rank in (0, 1)]


def test_every_rank_runs_rank_0s_k():
    """distributed/k_leader.py: rank 0's choice is every rank's (rank 1's own ignored), iteration by iteration,
    a follower waiting for a K rank 0 has not written yet; rank 0 removes the call's key afterwards."""
    import threading

    from specdec_fast.distributed.k_leader import LeaderK

    store = dist.HashStore()
    zero, one = (LeaderK(group, call=7) for group in _k_ranks(store))
    assert zero.leader and not one.leader and LeaderK.available(_k_ranks(store)[0])
    assert [zero.settle(i, k) for i, k in enumerate([4, 4, 2])] == [4, 4, 2]
    assert [one.settle(i, 1) for i in range(3)] == [4, 4, 2]
    later = threading.Timer(0.3, lambda: zero.settle(3, 6))  # the follower waits for it
    later.start()
    assert one.settle(3, 1) == 6
    later.join()
    assert store.get("specdec_fast/tp/test/k/7") == b"4,4,2,6,"
    zero.clear()
    assert not store.check(["specdec_fast/tp/test/k/7"])
    assert not LeaderK.available(_k_ranks(None)[0])


def test_a_failed_call_leaves_no_k_key():
    """LeaderK.abandon (the engine's way out of a failed call): rank 0 removes the call's key at once;
    a store that went with the failed group raises nothing over the call's own error."""
    from specdec_fast.distributed.k_leader import LeaderK

    store = dist.HashStore()
    zero, one = (LeaderK(group, call=3) for group in _k_ranks(store))
    assert [zero.settle(i, k) for i, k in enumerate([5, 3])] == [5, 3] and one.settle(0, 1) == 5
    one.abandon()  # a follower writes nothing
    assert store.check(["specdec_fast/tp/test/k/3"])
    zero.abandon()
    assert not store.check(["specdec_fast/tp/test/k/3"]) and zero.known == []

    class Gone:
        def delete_key(self, key):
            raise RuntimeError("Connection reset by peer")

    gone = LeaderK(_k_ranks(store)[0], call=4)
    gone.settle(0, 2)
    gone.store = Gone()
    gone.abandon()
    assert gone.known == []


def test_a_follower_waiting_for_rank_0_ends_on_its_failure_or_the_timeout():
    """A rank 0 that failed (its line in the failure channel) ends a follower's wait with that line; one that
    never writes ends it at the group's timeout."""
    from specdec_fast.distributed.failures import TensorParallelError
    from specdec_fast.distributed.k_leader import LeaderK

    store = dist.HashStore()
    zero, one = _k_ranks(store)
    zero.failures.publish(RuntimeError("injected in the draft"))
    with pytest.raises(TensorParallelError, match="rank 0 of 2 failed: RuntimeError: injected in the draft"):
        LeaderK(one, call=0).settle(0, 3)
    _, silent = _k_ranks(dist.HashStore(), timeout_s=0.5)
    with pytest.raises(TensorParallelError, match="rank 0's K of iteration 0 did not come within 0.5 s"):
        LeaderK(silent, call=0).settle(0, 3)


def test_rotates_reads_smollm3s_nope_layers_as_its_modules_do():
    """The tensor-parallel layer takes its rotation from paged_llama.rotates (the config): for SmolLM3
    it must match each attention module's use_rope (its NoPE layers), as the single-process runner reads."""
    from specdec_fast.runners.paged_llama import rotates

    model = make_model("smollm3", layers=4)
    uses = [bool(layer.self_attn.use_rope) for layer in model.model.layers]
    assert [rotates(model.config, i) for i in range(4)] == uses and not all(uses) and any(uses)


def test_a_family_without_a_tensor_parallel_runner_is_refused_by_name():
    """GPT-NeoX's runner has no tensor-parallel twin: refused by name before any collective."""
    from specdec_fast.runners.registry import shard_model

    with pytest.raises(ValueError, match="tensor parallelism supports model_type .* got 'gpt_neox'"):
        shard_model(make_model("gpt_neox"), process_group=None)


def test_olmo_with_biases_is_refused_under_tensor_parallelism():
    """The OLMo TP runner reads no projection bias: a checkpoint with attention_bias is refused by name, not run
    without its biases (a ShardedCausalLM stand-in holding one such shard: the check reads names only)."""
    from specdec_fast.runners.paged_olmo2_tp import tp_olmo2_unsupported_reason
    from specdec_fast.runners.sharded_model import ShardedCausalLM

    model = make_model("olmo2")
    sharded = ShardedCausalLM.__new__(ShardedCausalLM)
    torch.nn.Module.__init__(sharded)
    sharded.config, sharded.shards = model.config, {"model.layers.0.self_attn.q_proj.bias": torch.zeros(4)}
    sharded.rope_tables = {None: (None, 1.0, "default")}
    assert "projections with biases" in tp_olmo2_unsupported_reason(sharded)


@pytest.mark.parametrize("world", [2, 4])
def test_gemma4_is_split_by_each_layers_widths(world, tmp_path):
    """Gemma 4's layers differ in head width (12 sliding, 16 full) and KV heads (2, and 1 global: replicated), its
    KV-sharing layers' MLPs are twice as wide and hold no k / v: each rank's slices, read from the checkpoint as
    from the model, follow each layer's own widths (sharding.layer_dims_of); the per-layer inputs are whole."""
    model = make_model("gemma4_shared")
    model.config.tie_word_embeddings = False  # its own LM head in the checkpoint (a tied one is not saved)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.save_pretrained(tmp_path)
    plan = LlamaShardPlan.for_config(model.config, world, world - 1)
    assert plan.layer_dims == ((12, 2, 96), (16, 1, 96), (12, 2, 192), (16, 1, 192))
    read = assert_reads_as_the_model(tmp_path, model, world, world - 1)
    heads = 4 // world
    assert read["model.layers.0.self_attn.q_proj.weight"].shape == (heads * 12, 48)
    assert read["model.layers.1.self_attn.q_proj.weight"].shape == (heads * 16, 48)
    assert read["model.layers.1.self_attn.k_proj.weight"].shape == (16, 48)  # the one global KV head, on every rank
    assert read["model.layers.0.self_attn.k_proj.weight"].shape == ((2 // world or 1) * 12, 48)
    assert read["model.layers.3.mlp.gate_proj.weight"].shape == (192 // world, 48)
    assert "model.layers.3.self_attn.k_proj.weight" not in read
    assert read["model.embed_tokens_per_layer.weight"].shape == (model.config.vocab_size_per_layer_input, 4 * 8)


@pytest.mark.parametrize("world", [2, 4])
def test_mimo_is_split_by_each_layers_kv_heads_and_its_value_width(world, tmp_path):
    """MiMo-V2-Flash's full layer has 2 KV heads (replicated at 4 ranks), its sliding layer 4, and its value heads
    are 8 wide against the keys' 12: each rank's slices, read from the checkpoint as from the model, follow each
    layer's KV heads (sharding.layer_dims_of) and the value width (v_proj's rows, o_proj's columns: the plan's
    value_dim); the sliding layer's sinks by query heads; the checkpoint's MTP layers (model.mtp.*) not read."""
    import safetensors.torch

    model = make_model("mimo_v2_flash")
    model.save_pretrained(tmp_path)
    mtp = {"model.mtp.layers.0.self_attn.q_proj.weight": torch.zeros(48, 48)}  # as the published checkpoint's
    safetensors.torch.save_file(mtp, str(tmp_path / "mtp.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    if index.exists():  # a sharded save: the MTP file joins the index as a published one would
        import json

        data = json.loads(index.read_text())
        data["weight_map"].update({name: "mtp.safetensors" for name in mtp})
        index.write_text(json.dumps(data))
    plan = LlamaShardPlan.for_config(model.config, world, world - 1)
    assert plan.layer_dims == ((12, 2, 96), (12, 4, 96)) and plan.value_dim == 8
    read = assert_reads_as_the_model(tmp_path, model, world, world - 1)
    heads = 4 // world
    assert read["model.layers.0.self_attn.k_proj.weight"].shape == ((2 // world or 1) * 12, 48)
    assert read["model.layers.0.self_attn.v_proj.weight"].shape == ((2 // world or 1) * 8, 48)
    assert read["model.layers.1.self_attn.k_proj.weight"].shape == (4 // world * 12, 48)
    assert read["model.layers.1.self_attn.v_proj.weight"].shape == (4 // world * 8, 48)
    assert read["model.layers.1.self_attn.o_proj.weight"].shape == (48, heads * 8)
    assert read["model.layers.1.self_attn.sinks"].shape == (heads,)
    assert not any(name.startswith("model.mtp.") for name in read)
    shards = [shards_from_state(model.state_dict(), LlamaShardPlan.for_config(model.config, world, r))
              for r in range(world)]
    for name in ("model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                 "model.layers.1.self_attn.sinks"):
        assert torch.equal(torch.cat([s[name] for s in shards]), model.state_dict()[name]), name
    assert torch.equal(torch.cat([s["model.layers.1.self_attn.o_proj.weight"] for s in shards], 1),
                       model.state_dict()["model.layers.1.self_attn.o_proj.weight"])


@pytest.mark.parametrize("gating", ["per-head", "per-element"])
def test_laguna_is_split_by_each_layers_query_heads(gating):
    """Laguna's layers of 4 and 6 query heads over 2 KV heads: each layer's q / o and output gate split by its own
    heads (sharding.layer_heads_of), the gate a row per head or per query channel (gate_rows_of); the slices tile
    the tensors back; a layer whose heads do not split over the ranks is refused by name."""
    import transformers as tf

    config = make_model("laguna").config
    config.gating = gating
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    assert plans[0].layer_heads == (4, 6) and plans[0].gate_rows == (1 if gating == "per-head" else 12)
    shards = [shards_from_state(state, p) for p in plans]
    for i, heads in enumerate((4, 6)):
        prefix = f"model.layers.{i}.self_attn."
        assert shards[1][prefix + "q_proj.weight"].shape == (heads // 2 * 12, 48)
        assert shards[1][prefix + "o_proj.weight"].shape == (48, heads // 2 * 12)
        assert shards[1][prefix + "g_proj.weight"].shape[0] == heads // 2 * plans[0].gate_rows
        for name, dim in (("q_proj.weight", 0), ("g_proj.weight", 0), ("o_proj.weight", 1)):
            assert torch.equal(torch.cat([s[prefix + name] for s in shards], dim), state[prefix + name]), name
    with pytest.raises(ValueError, match="layer 1's 6 query heads do not split over 4"):
        LlamaShardPlan.for_config(model.config, 4, 0)


def test_olmo_hybrid_is_split_by_heads():
    """OLMo Hybrid at 2 ranks: the DeltaNet's q / k rows by key heads (2 of 8 each), v / g rows by value heads (4 of
    12), b / a by value heads, o_proj's columns, the convolution's [q | k | v] channels of each part; the attention
    layer's q_proj by heads alone (OLMo 3's, not Qwen3-Next's [q | gate] rows) with its whole-projection norm split
    as its rows. Every slice tiles its tensor back."""
    model = make_model("olmo_hybrid", layers=3)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    delta, attn = "model.layers.0.linear_attn.", "model.layers.2.self_attn."
    expected = {delta + "q_proj.weight": (8, 48), delta + "v_proj.weight": (24, 48), delta + "g_proj.weight": (24, 48),
                delta + "b_proj.weight": (2, 48), delta + "o_proj.weight": (48, 24), delta + "conv1d.weight": (40, 1, 4),
                attn + "q_proj.weight": (24, 48), attn + "q_norm.weight": (24,), attn + "o_proj.weight": (48, 24)}
    for name, shape in expected.items():
        assert shards[1][name].shape == shape, name
        part = plans[0].slice_of(name)
        if not isinstance(part, tuple):
            assert torch.equal(torch.cat([s[name] for s in shards], part.dim), state[name]), name


def test_minimax_lightning_layers_are_split_by_heads():
    """MiniMax at 2 ranks: a lightning layer's qkv_proj rows by heads (each head's [q | k | v]: 2 of 4 heads x 36
    rows), output_gate's rows and the output norm's weights (2 x 12), out_proj's columns; the attention layer as the
    Llama layout's; the experts by their width. Every slice tiles its tensor back, and rank 1's lightning rows are
    heads 2 and 3's [q | k | v] as transformers' forward splits them."""
    model = make_model("minimax", layers=3)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    lin, attn = "model.layers.0.self_attn.", "model.layers.2.self_attn."
    expected = {lin + "qkv_proj.weight": (72, 48), lin + "output_gate.weight": (24, 48), lin + "norm.weight": (24,),
                lin + "out_proj.weight": (48, 24), attn + "q_proj.weight": (24, 48), attn + "k_proj.weight": (12, 48),
                attn + "o_proj.weight": (48, 24), "model.layers.0.mlp.experts.gate_up_proj": (8, 24, 48),
                "model.layers.0.mlp.gate.weight": (8, 48)}
    for name, shape in expected.items():
        assert tuple(shards[1][name].shape) == shape, name
        part = plans[0].slice_of(name)
        if part is not None and not isinstance(part, tuple):
            assert torch.equal(torch.cat([s[name] for s in shards], part.dim), state[name]), name
    per_head = state[lin + "qkv_proj.weight"].view(4, 36, 48)  # transformers: reshape(.., heads, 3 D), then split
    assert torch.equal(shards[1][lin + "qkv_proj.weight"].view(2, 36, 48), per_head[2:])
    # the decays transformers saves with the model (its buffers) are not read: the runner computes the slopes
    assert lin + "slope_rate" in state and not any(name.endswith("decay") or name.endswith("slope_rate")
                                                    for name in shards[0])


def test_jamba_mamba_layers_are_split_by_channels():
    """Jamba at 2 ranks: a Mamba1 layer's in_proj rows of each of [x | z] (48 of 96 channels each), the convolution's,
    dt_proj's, A_log's and D's rows, x_proj's and out_proj's columns, the dt / B / C norms whole; the attention layer
    as the Llama layout's; no rotary module (its attention has no positions). Every slice tiles its tensor back."""
    from specdec_fast.runners.sharded_model import rotary_of

    model = make_model("jamba", layers=4)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    mamba, attn = "model.layers.0.mamba.", "model.layers.1.self_attn."
    expected = {mamba + "in_proj.weight": (96, 48), mamba + "conv1d.weight": (48, 1, 4), mamba + "conv1d.bias": (48,),
                mamba + "x_proj.weight": (22, 48), mamba + "dt_proj.weight": (48, 6), mamba + "dt_proj.bias": (48,),
                mamba + "A_log": (48, 8), mamba + "D": (48,), mamba + "out_proj.weight": (48, 48),
                mamba + "dt_layernorm.weight": (6,), attn + "q_proj.weight": (24, 48), attn + "o_proj.weight": (48, 24)}
    for name, shape in expected.items():
        assert tuple(shards[1][name].shape) == shape, name
        part = plans[0].slice_of(name)
        if part is not None and not isinstance(part, tuple):
            assert torch.equal(torch.cat([s[name] for s in shards], part.dim), state[name]), name
    x, z = state[mamba + "in_proj.weight"].chunk(2)
    assert torch.equal(shards[1][mamba + "in_proj.weight"], torch.cat((x[48:], z[48:])))
    assert rotary_of(model.config) is None
    with pytest.raises(ValueError, match="Mamba layers' 96 channels are not divisible by 5"):
        model.config.vocab_size, model.config.num_attention_heads, model.config.intermediate_size = 130, 5, 95
        model.config.num_key_value_heads = 5
        LlamaShardPlan.for_config(model.config, 5, 0)


def test_nemotron_h_mamba2_layers_are_split_by_heads_and_read_from_its_published_names(tmp_path):
    """Nemotron-H at 2 ranks (a Mamba2 layer of 6 heads of 8, 2 groups of state 8): in_proj's rows of z / x / dt by
    heads and of B / C by group (rank 1: heads 3-5, group 1), the convolution's [x | B | C] rows likewise, dt_bias /
    A_log / D and the gated norm by heads, out_proj's columns; at 4 ranks of a 4-head, 1-group model every rank reads
    the one group; the attention and relu² MLP as the Llama layout's, each block's mixer under its layout name.
    Read from a checkpoint under the published names (backbone.*, every block's tensors under mixer.), every slice
    equals the loaded model's. 6 heads do not split over 4 ranks, nor 2 groups over 3."""
    from safetensors.torch import save_file

    from specdec_fast.runners.sharded_model import rotary_of

    model = make_model("nemotron_h")
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    mamba, attn, mlp = "model.layers.0.mamba.", "model.layers.1.self_attn.", "model.layers.2.mlp."
    original = state["model.layers.0.mixer.in_proj.weight"]  # [z 48 | x 48 | B 16 | C 16 | dt 6] rows
    assert torch.equal(shards[1][mamba + "in_proj.weight"], torch.cat((original[24:48], original[72:96],
                                                                       original[104:112], original[120:128],
                                                                       original[131:134])))
    conv = state["model.layers.0.mixer.conv1d.weight"]  # [x 48 | B 16 | C 16] channels
    assert torch.equal(shards[1][mamba + "conv1d.weight"], torch.cat((conv[24:48], conv[56:64], conv[72:80])))
    expected = {mamba + "dt_bias": (3,), mamba + "A_log": (3,), mamba + "D": (3,), mamba + "norm.weight": (24,),
                mamba + "out_proj.weight": (48, 24), attn + "q_proj.weight": (24, 48), attn + "o_proj.weight": (48, 24),
                mlp + "up_proj.weight": (48, 48), mlp + "down_proj.weight": (48, 48),
                "model.layers.0.input_layernorm.weight": (48,), "model.norm.weight": (48,),
                "model.embed_tokens.weight": (64, 48)}
    for name, shape in expected.items():
        assert tuple(shards[1][name].shape) == shape, name
    assert rotary_of(model.config) is None
    published = {name.replace("model.", "backbone.", 1): tensor.contiguous() for name, tensor in state.items()}
    model.config.save_pretrained(tmp_path)
    save_file(published, str(tmp_path / "model.safetensors"))
    for rank, plan in enumerate(plans):
        read = shards_from_safetensors(str(tmp_path), plan)
        assert read.keys() == shards[rank].keys() and all(torch.equal(read[n], shards[rank][n]) for n in read)
    one = make_model("nemotron_h").config
    one.mamba_num_heads, one.n_groups = 4, 1
    assert [LlamaShardPlan.for_config(one, 4, r).mamba2_groups for r in range(4)] == [(0, 1)] * 4
    with pytest.raises(ValueError, match="the Mamba2 layers' 6 heads are not divisible by 4"):
        LlamaShardPlan.for_config(model.config, 4, 0)
    model.config.mamba_num_heads = 3
    with pytest.raises(ValueError, match="n_groups 2 neither divides nor is divisible by 3"):
        model.config.vocab_size, model.config.num_attention_heads, model.config.intermediate_size = 129, 3, 96
        model.config.num_key_value_heads = 3
        LlamaShardPlan.for_config(model.config, 3, 0)


def test_nemotron_3_moe_blocks_are_split_by_width_and_read_per_expert(tmp_path):
    """Nemotron 3's MoE blocks at 2 ranks (8 ungated experts of 32 in a latent width of 24, a shared MLP of 48): every
    expert's up rows and down columns by the width (16 each), the shared MLP's likewise (24), the router, its
    correction bias and the latent projections whole. Read from a checkpoint under the published names (backbone.*,
    the experts per expert: mixer.experts.{e}.up_proj / down_proj), every slice equals the loaded model's."""
    from safetensors.torch import save_file

    from ..engine.test_paged_nemotron_h import tiny_nemotron_h

    model = tiny_nemotron_h(kind="moe_latent")
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    block = "model.layers.1.mlp."
    expected = {"experts.up_proj": (8, 16, 24), "experts.down_proj": (8, 24, 16), "gate.weight": (8, 64),
                "gate.e_score_correction_bias": (8,), "shared_experts.up_proj.weight": (24, 64),
                "shared_experts.down_proj.weight": (64, 24), "fc1_latent_proj.weight": (24, 64),
                "fc2_latent_proj.weight": (64, 24)}
    for name, shape in expected.items():
        assert tuple(shards[1][block + name].shape) == shape, name
    assert torch.equal(shards[1][block + "experts.up_proj"], state["model.layers.1.mixer.experts.up_proj"][:, 16:])
    published = {}
    for name, tensor in state.items():
        name = name.replace("model.", "backbone.", 1)
        if name.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):
            for e in range(tensor.shape[0]):
                published[f"{name.rsplit('.', 1)[0]}.{e}.{name.rsplit('.', 1)[1]}.weight"] = tensor[e].contiguous()
        else:
            published[name] = tensor.contiguous()
    model.config.save_pretrained(tmp_path)
    save_file(published, str(tmp_path / "model.safetensors"))
    for rank, plan in enumerate(plans):
        read = shards_from_safetensors(str(tmp_path), plan)
        assert read.keys() == shards[rank].keys() and all(torch.equal(read[n], shards[rank][n]) for n in read)


def test_granite_4_0_h_shards_its_shared_mlp_and_its_one_mamba2_group():
    """Granite 4.0-H without experts at 2 ranks: the shared MLP's width is shared_intermediate_size (48), not
    intermediate_size (32, the experts'): input_linear's [gate | up] rows 24 + 24 and output_linear's 24 columns;
    a Mamba2 layer of 8 heads of 16 and one group of state 16: both ranks read the group's B and C rows (and the
    convolution's), each its 4 heads' z / x / dt. Bamba's feed_forward MLP as Llama's."""
    from ..engine.test_paged_granite_hybrid import tiny_granite_hybrid

    model = tiny_granite_hybrid("h_micro", mamba_n_groups=1)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    assert plans[1].intermediate == 48 and plans[1].moe_layout is None and plans[1].mamba2_groups == (0, 1)
    layer = "model.layers.0."
    assert tuple(shards[1][layer + "mlp.gate_up_proj.weight"].shape) == (48, 64)
    gate_up = state[layer + "shared_mlp.input_linear.weight"]
    assert torch.equal(shards[1][layer + "mlp.gate_up_proj.weight"], torch.cat((gate_up[24:48], gate_up[72:96])))
    assert tuple(shards[1][layer + "mlp.down_proj.weight"].shape) == (64, 24)
    in_proj = state[layer + "mamba.in_proj.weight"]  # [z 128 | x 128 | B 16 | C 16 | dt 8]
    for rank in range(2):
        expected = torch.cat((in_proj[rank * 64:(rank + 1) * 64], in_proj[128 + rank * 64:128 + (rank + 1) * 64],
                              in_proj[256:288], in_proj[288 + rank * 4:288 + (rank + 1) * 4]))
        assert torch.equal(shards[rank][layer + "mamba.in_proj.weight"], expected), rank
    bamba = tiny_granite_hybrid("bamba")
    shard = shards_from_state(bamba.state_dict(), LlamaShardPlan.for_config(bamba.config, 2, 1))
    assert tuple(shard["model.layers.1.mlp.gate_proj.weight"].shape) == (48, 64)


def test_falcon_h1_mup_vector_follows_each_rank_s_rows():
    """Falcon-H1's μP vector (transformers' compute_mup_vector: a buffer in no checkpoint) built for each rank's in_proj
    rows equals the whole vector's slice by the same rows, at 2 ranks with 2 groups (each rank its own) and with one
    group (shared: both ranks read its B / C rows); the layer's other tensors as Nemotron-H's / Llama's."""
    from transformers.models.falcon_h1.modeling_falcon_h1 import compute_mup_vector

    from specdec_fast.runners.paged_falcon_h1_tp import local_mup_vector
    from specdec_fast.runners.sharding import Slice

    for groups in (2, 1):
        config = make_model("falcon_h1").config
        config.mamba_n_groups = groups
        whole = compute_mup_vector(config).reshape(-1)
        for rank in range(2):
            plan = LlamaShardPlan.for_config(config, 2, rank)
            parts = plan.slice_of("model.layers.0.mamba.in_proj.weight")
            expected = torch.cat([whole[part.start:part.stop] for part in parts if isinstance(part, Slice)])
            assert torch.equal(local_mup_vector(config, plan, "cpu"), expected), (groups, rank)
    shard = shards_from_state(make_model("falcon_h1").state_dict(), plan)
    assert tuple(shard["model.layers.0.mlp.gate_proj.weight"].shape) == (48, 48)
    assert tuple(shard["model.layers.0.self_attn.q_proj.weight"].shape) == (24, 48)


@pytest.mark.parametrize("kind", ["granitemoe", "granite 4.0-h"])
def test_granite_moe_reads_its_published_names(tmp_path, kind):
    """Granite 3 MoE's and Granite 4.0-H's published block names (block_sparse_moe.input_linear / output_linear /
    router.layer, which transformers renames on loading) read as the loaded model's shards (Granite 4.0-H's beside its
    shared_mlp and Mamba2 layers)."""
    from safetensors.torch import save_file

    from specdec_fast.runners.sharding import shards_from_safetensors

    from ..engine.test_paged_granite_hybrid import tiny_granite_hybrid

    model = make_model("granitemoe") if kind == "granitemoe" else tiny_granite_hybrid("h_tiny")
    published = {}
    for name, tensor in model.state_dict().items():
        for new, old in ((".experts.gate_up_proj", ".input_linear.weight"), (".experts.down_proj", ".output_linear.weight"),
                         (".router.weight", ".router.layer.weight")):
            name = name.replace(".block_sparse_moe" + new, ".block_sparse_moe" + old)
        published[name] = tensor.contiguous()
    assert any(".input_linear." in name for name in published) and any(".router.layer." in name for name in published)
    model.config.save_pretrained(tmp_path)
    save_file(published, str(tmp_path / "model.safetensors"))
    for rank in range(2):
        plan = LlamaShardPlan.for_config(model.config, 2, rank)
        read, expected = shards_from_safetensors(str(tmp_path), plan), shards_from_state(model.state_dict(), plan)
        assert read.keys() == expected.keys() and all(torch.equal(read[n], expected[n]) for n in read)


def test_axk1_reads_its_published_output_norms(tmp_path):
    """A.X-K1 publishes the norm of a sparse layer's MoE output beside the layer's norms (post_mlp_layernorm, on every
    layer), which transformers reads under the block (mlp.post_mlp_layernorm) and only where the layer is sparse: each
    rank reads it whole under that name, equal to the loaded model's; the dense layer's is renamed but read by nothing
    (runners/paged_mla_tp.py takes it only where the layer has experts)."""
    from safetensors.torch import save_file

    from specdec_fast.runners.sharding import shards_from_safetensors

    model = make_model("axk1")
    published = {name.replace(".mlp.post_mlp_layernorm.", ".post_mlp_layernorm."): tensor.contiguous()
                 for name, tensor in model.state_dict().items()}
    published["model.layers.0.post_mlp_layernorm.weight"] = torch.full((48,), 7.0)  # the dense layer's, unread
    assert "model.layers.1.post_mlp_layernorm.weight" in published
    model.config.save_pretrained(tmp_path)
    save_file(published, str(tmp_path / "model.safetensors"))
    for rank in range(2):
        plan = LlamaShardPlan.for_config(model.config, 2, rank)
        read, expected = shards_from_safetensors(str(tmp_path), plan), shards_from_state(model.state_dict(), plan)
        assert read.keys() - expected.keys() == {"model.layers.0.mlp.post_mlp_layernorm.weight"}
        assert all(torch.equal(read[n], expected[n]) for n in expected)
        assert torch.equal(read["model.layers.1.mlp.post_mlp_layernorm.weight"],
                           model.model.layers[1].mlp.post_mlp_layernorm.weight)


@pytest.mark.parametrize("kind, published_names", [
    ("kolibri1", ((".mlp.gate.e_score_correction_bias", ".moe.router.expert_bias"),
                  (".post_self_attn_layernorm.", ".post_attn_norm."), (".post_mlp_layernorm.", ".post_ffn_norm."))),
    ("flint", ((".self_attn.sinks", ".self_attn.softmax_offset"),))])
def test_kolibri1_and_flint_read_their_published_names(kind, published_names, tmp_path):
    """Kolibri-1's router bias and post-branch norms, Flint's sinks, under their published names (which transformers'
    conversion_mapping.py renames on loading): every rank's slices equal the loaded model's shards."""
    from safetensors.torch import save_file

    from specdec_fast.runners.sharding import shards_from_safetensors

    model = make_model(kind)
    published = {}
    for name, tensor in model.state_dict().items():
        for ours, theirs in published_names:
            name = name.replace(ours, theirs)
        published[name] = tensor.contiguous()
    assert all(any(theirs in name for name in published) for _, theirs in published_names)
    model.config.save_pretrained(tmp_path)
    save_file(published, str(tmp_path / "model.safetensors"))
    for rank in range(2):
        plan = LlamaShardPlan.for_config(model.config, 2, rank)
        read, expected = shards_from_safetensors(str(tmp_path), plan), shards_from_state(model.state_dict(), plan)
        assert read.keys() == expected.keys() and all(torch.equal(read[n], expected[n]) for n in read)


def test_kimi_linear_is_split_by_heads_and_reads_its_published_names(tmp_path):
    """Kimi Linear at 2 ranks: a KDA layer's q / k / v / f_b / g_b rows by heads (2 of 4 heads x 12), the convolution's
    rows of each [q | k | v] part, dt_bias, b_proj and A_log ([1, 1, H, 1]) by heads, o_proj's columns, f_a / g_a and
    the per-head norm whole; the latent attention layer as MLA's (q / kv_b rows by heads, the latent's projection
    whole). Read from a saved checkpoint (the published names: the forget gate's tensors beside the attention's, every
    MLP under block_sparse_moe, the experts per expert as w1 / w3 / w2, the convolutions q_ / k_ / v_conv1d apart),
    every slice equals the loaded model's, the three convolutions' rows concatenated its convolution's."""
    from specdec_fast.runners.sharding import shards_from_safetensors

    model = make_model("kimi_linear", layers=3)
    state = model.state_dict()
    plans = [LlamaShardPlan.for_config(model.config, 2, r) for r in range(2)]
    shards = [shards_from_state(state, p) for p in plans]
    kda, mla = "model.layers.0.self_attn.", "model.layers.2.self_attn."
    expected = {kda + "q_proj.weight": (24, 48), kda + "conv1d.weight": (72, 1, 4), kda + "forget_gate.f_b_proj.weight":
                (24, 12), kda + "forget_gate.f_a_proj.weight": (12, 48), kda + "forget_gate.dt_bias": (24,),
                kda + "forget_gate.A_log": (1, 1, 2, 1), kda + "b_proj.weight": (2, 48), kda + "g_b_proj.weight": (24, 12),
                kda + "o_norm.weight": (12,), kda + "o_proj.weight": (48, 24), mla + "q_proj.weight": (40, 48),
                mla + "kv_a_proj_with_mqa.weight": (24, 48), mla + "kv_b_proj.weight": (48, 16),
                mla + "o_proj.weight": (48, 24)}
    for name, shape in expected.items():
        assert tuple(shards[1][name].shape) == shape, name
    conv = state[kda + "conv1d.weight"]
    assert torch.equal(shards[1][kda + "conv1d.weight"], torch.cat([conv[i * 48 + 24:(i + 1) * 48] for i in range(3)]))
    model.save_pretrained(tmp_path)
    for rank, plan in enumerate(plans):
        read = shards_from_safetensors(str(tmp_path), plan)
        for layer in plan.kda[0]:  # the KDA layers' convolutions, apart in the checkpoint
            prefix = f"model.layers.{layer}.self_attn."
            convs = [read.pop(prefix + f"{p}_conv1d.weight") for p in "qkv"]
            assert torch.equal(torch.cat(convs), shards[rank].pop(prefix + "conv1d.weight"))
        assert read.keys() == shards[rank].keys()
        assert all(torch.equal(read[name], shards[rank][name]) for name in read)


def test_a_nope_olmo_hybrid_shards_without_a_rotary_module():
    """An OLMo Hybrid config without a rope_theta builds no rotary module (every attention layer NoPE): rotary_of
    gives None (transformers' rotary class would raise KeyError on it) and the ShardedCausalLM holds no RoPE tables,
    which the tensor-parallel runner reads as NoPE (2 gloo ranks gave one process's greedy and sampled tokens)."""
    import transformers as tf

    from specdec_fast.runners.paged_olmo_hybrid_tp import tp_olmo_hybrid_unsupported_reason
    from specdec_fast.runners.sharded_model import ShardedCausalLM, rotary_of

    config = make_model("olmo_hybrid", layers=3).config
    config.rope_parameters = {"rope_type": "default"}
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    assert model.model.rotary_emb is None and rotary_of(config) is None
    plan = LlamaShardPlan.for_config(config, 2, 0)
    sharded = ShardedCausalLM(config, shards_from_state(model.state_dict(), plan), plan, None, None)
    assert sharded.rope_tables == {} and sharded.inv_freq is None
    assert tp_olmo_hybrid_unsupported_reason(sharded) is None
