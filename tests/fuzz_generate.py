"""A differential fuzzer of generate(): random combinations of options, drafting, backends, runners
and graph modes, each call checked against an oracle that must give the same tokens.

    python -m tests.fuzz_generate --mode greedy  --seed 1 --iterations 300   # vs model.generate
    python -m tests.fuzz_generate --mode sampled --seed 1 --iterations 100   # the paths agree
    python -m tests.fuzz_generate --mode families --seed 1 --iterations 300  # tiny models, processors
    python -m tests.fuzz_generate --mode chat --seed 1 --iterations 100      # a chat loop over a cache
    python -m tests.fuzz_generate --mode families --recurrent --small-chunks  # the recurrent families alone,
                                                                             # their prefills in chunks of 4

greedy: the demo pair (trained, byte-level tokenizer: stop strings end rows) through
specdec_fast.generate or a bound patch_generate (a harness's keywords: use_cache, max_length),
against transformers' generate(do_sample=False) on the same call: tokens, scores / logits of an
output dict to 1e-3, and at batch 1 what a streamer was given (the prompt, the new tokens in
order, one end). sampled: one seeded sampled call through every path that must draw the
same tokens (eager, the static graph twin, the cached engine again, the torch backend, the hf
runner; with --triton the interpreted Triton kernels every third case). The compiled CPU backend
is the C++ one where the kernel tests run it (tests/kernels/backends.py); without it, the torch
reference alone and no static twin. families: the tests' tiny Llama / Qwen2 / GPT-2 / Phi-3 /
Granite / SmolLM3 / OLMo 3 / Gemma 1 / Gemma 3 / StarCoder2 / GPT-NeoX / OPT / Cohere / GPT-BigCode models, and
Mistral / Gemma 2 / Cohere 2 / CWM with sliding windows of 8 that the rows pass, Ministral 3 past
its query temperature's threshold, Mixtral / Qwen3-MoE / Qwen2-MoE (a shared expert) / GPT-OSS (sinks, windows
of 8) / GLM-4.5 (grouped sigmoid routing, a partial rotary embedding) / EXAONE MoE / Solar Open / OLMoE,
DeepSeek-V2 / V3 (latent attention), GLM-4.5, DeepSeek-V3 and Qwen3-Next with their MTP layers (use_mtp), Qwen3-Next
(recurrent layers rolled back), MiniMax-M2, ERNIE 4.5 MoE, with
transformers' processors (test_generate_processors.OPTIONS), user
processors and stopping criteria, against model.generate. chat: a greedy chat loop over one
transformers cache a side (generate(cache=...)), turn by turn against model.generate's.

A refusal is a pass where both sides refuse, or where ours is an Unsupported*Error (which
patch_generate hands to transformers); the summary counts them. Known refusals are not drawn:
trees need paged runners (and take no guidance_scale, not drawn; in the families mode they are drawn for the
recurrent families only: the others' trees are the trees mode's); the static twin needs paged runners and
compiled kernels; greedy calls take no num_return_sequences > 1 (transformers refuses them).
Exit status 1 when a case failed; each failure prints its case, enough to rerun it.
tests/engine/test_fuzz_generate.py runs a few cases of each mode in the suite.
"""
import argparse
import copy
import itertools
import json
import random
import tempfile
import warnings

import torch

GREEDY_PROMPTS = ["def binary_search(a, x):", "class Queue:", "import os\n\ndef main(", "for i in range(",
                  "# sort a list\n", "x = [", "def f(n):\n    if n", "while True:\n", "print(", "return"]
STOP_STRINGS = ["return", ":\n", "(", "  ", "\n\n", "if", "self", "]", "=="]
TREE_BRANCHINGS = ([2, 1, 1], [2, 2], [3, 1, 1, 1], [1, 1, 1])
# The drafting keywords _drafting chooses among: what a case that drafts otherwise removes
DRAFTING_KEYS = ("assistant_model", "num_assistant_tokens", "num_assistant_tokens_schedule", "prompt_lookup_num_tokens")


def _compiled_cpu_backend() -> str | None:
    """The C++ backend's name where the kernel tests run it (tests/kernels/backends.py), else None:
    the models here are on the CPU, where the static twin needs compiled kernels."""
    from tests.kernels.backends import kernel_backends

    return "cpp" if "cpp" in kernel_backends() else None


def _demo():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import specdec_fast

    target_dir, draft_dir = specdec_fast.demo_pair()
    return (AutoTokenizer.from_pretrained(target_dir, padding_side="left"),
            AutoModelForCausalLM.from_pretrained(target_dir).eval(), AutoModelForCausalLM.from_pretrained(draft_dir).eval(),
            target_dir)


# The families whose runners keep recurrent states (runners/paged_recurrent.py): trees drawn in the families mode
RECURRENT_KINDS = ("qwen3_next", "qwen3_next_mtp", "nemotron_h", "granite_h", "falcon_h1", "olmo_hybrid", "lfm2",
                   "lfm2_moe", "lfm3", "mamba2", "mamba", "falcon_mamba", "jamba", "minimax", "kimi_linear")


def _drafting(rng, draft, *, tree_ok: bool, triton: bool, adaptive: bool = True) -> dict:
    """Our side of a case: a drafter (draft model, tree, prompt lookup or none), a backend and a
    runner, and the graph mode where the static twin can run."""
    from specdec_fast.drafters.token_tree import TokenTree

    kind = rng.choice(["draft", "draft", "tree", "lookup", "plain"] if tree_ok else ["draft", "draft", "lookup", "plain"])
    ours = {}
    if kind in ("draft", "tree"):
        ours["assistant_model"] = draft
        if kind == "tree":
            ours["tree"] = TokenTree.from_branching(rng.choice(TREE_BRANCHINGS), rng.choice(["top", "sample"]))
        elif adaptive and rng.random() < 0.2:
            ours["num_assistant_tokens_schedule"] = "adaptive"
        else:
            ours["num_assistant_tokens"] = rng.choice([1, 2, 4, 6])
    elif kind == "lookup":
        ours["prompt_lookup_num_tokens"] = rng.randint(1, 5)
    compiled = _compiled_cpu_backend()
    backends = ["torch"] + [compiled] * 8 * bool(compiled) + (["triton"] if triton else [])
    ours["backend"] = rng.choice(backends)
    ours["runner"] = "paged" if kind == "tree" else rng.choice(["paged", "paged", "hf"])
    if ours["runner"] == "paged" and ours["backend"] != "torch":
        ours["cuda_graphs"] = rng.choice([False, "static"])
    return ours


def _described(opts: dict, ours: dict, **more) -> str:
    plain = lambda v: v if isinstance(v, (int, float, str, bool, list, tuple, type(None))) else type(v).__name__  # noqa: E731
    return json.dumps({"options": {k: plain(v) for k, v in opts.items() if k != "tokenizer"},
                       "ours": {k: plain(v) for k, v in ours.items()}, **more}, default=str)


def _refusal_agrees(expected, got) -> bool:
    """Both refused; or ours refused with an Unsupported*Error (patch_generate's fallback)."""
    if isinstance(expected, Exception) and isinstance(got, Exception):
        return True
    return isinstance(got, Exception) and type(got).__name__.startswith("Unsupported")


def _compare(expected, got) -> str | None:
    """None where the two results agree, else what differs."""
    if isinstance(expected, Exception) or isinstance(got, Exception):
        return None if _refusal_agrees(expected, got) else f"hf: {expected!r}\n ours: {got!r}"
    if isinstance(expected, torch.Tensor) != isinstance(got, torch.Tensor):
        return f"hf returned a {type(expected).__name__}, ours a {type(got).__name__}"
    if isinstance(expected, torch.Tensor):
        return None if torch.equal(expected, got) else f"tokens\n hf:   {expected.tolist()}\n ours: {got.tolist()}"
    if not torch.equal(expected.sequences, got.sequences):
        return f"sequences\n hf:   {expected.sequences.tolist()}\n ours: {got.sequences.tolist()}"
    for field in ("scores", "logits"):
        want, have = getattr(expected, field, None), getattr(got, field, None)
        if (want is None) != (have is None) or (want is not None and len(want) != len(have)):
            return f"{field}: {None if want is None else len(want)} steps against {None if have is None else len(have)}"
        for step, (a, b) in enumerate(zip(want or (), have or ())):
            finite = torch.isfinite(a)
            if a.shape != b.shape or not torch.equal(finite, torch.isfinite(b)) or \
                    not torch.allclose(a[finite], b[finite], atol=1e-3, rtol=1e-3):
                return f"{field} of step {step}"
    return None


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # a refusal is compared, not raised
        return exc


def greedy_cases(seed: int, iterations: int, triton: bool = False):
    """Yields (case number, description, failure or None) of greedy calls on the demo pair."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    import specdec_fast

    tok, target, draft, target_dir = _demo()
    harness_model = AutoModelForCausalLM.from_pretrained(target_dir).eval()  # the model a harness patched
    for it in range(iterations):
        rng = random.Random(seed * 100003 + it)
        batch = tok(rng.sample(GREEDY_PROMPTS, rng.randint(1, 4)), return_tensors="pt", padding=True)
        opts = dict(do_sample=False, pad_token_id=tok.pad_token_id)
        if rng.random() < 0.5:
            opts["max_new_tokens"] = rng.randint(1, 40)
        else:
            opts["max_length"] = batch.input_ids.shape[1] + rng.randint(1, 40)
        if rng.random() < 0.4:
            opts.update(stop_strings=rng.sample(STOP_STRINGS, rng.randint(1, 3)), tokenizer=tok)
        if rng.random() < 0.5:
            opts["eos_token_id"] = tok.eos_token_id if rng.random() < 0.5 else [tok.eos_token_id, rng.randrange(3, 200)]
        ours = _drafting(rng, draft, tree_ok=True, triton=triton)
        if rng.random() < 0.3:
            opts["repetition_penalty"] = rng.choice([1.05, 1.3])
        if rng.random() < 0.2:
            opts["no_repeat_ngram_size"] = rng.choice([2, 3])
        if rng.random() < 0.2:
            opts["min_new_tokens"] = rng.randint(1, 8)
        if rng.random() < 0.25:
            opts.update(return_dict_in_generate=True, output_scores=True, output_logits=rng.random() < 0.5)
        via_patch = rng.random() < 0.3
        route = rng.choice(["keywords"] * 6 + ["generation_config", "model defaults"])
        if route != "keywords":  # the call's options as a GenerationConfig, or as the model's own defaults
            fields = {k: v for k, v in opts.items() if k not in ("tokenizer", "stop_strings", "return_dict_in_generate",
                                                                 "output_scores", "output_logits")}
            opts = {k: v for k, v in opts.items() if k not in fields}
            try:
                config = GenerationConfig(**fields)
            except ValueError:  # its own validation (greedy num_return_sequences > 1): as keywords then
                route, opts = "keywords", {**opts, **fields}
            if route == "generation_config":
                opts["generation_config"] = config
        models = [target, harness_model] if via_patch else [target]  # the oracle reads the same defaults
        saved = [copy.deepcopy(model.generation_config) for model in models]
        if route == "model defaults":
            for model in models:
                model.generation_config.update(**fields)
        streams = [Recorder(), Recorder()] if batch.input_ids.shape[0] == 1 and rng.random() < 0.3 else None
        streamer = (lambda side: {"streamer": streams[side]}) if streams else (lambda side: {})  # noqa: E731
        expected = _call(target.generate, batch.input_ids, attention_mask=batch.attention_mask, **opts, **streamer(0))
        if via_patch:
            with specdec_fast.patch_generate(harness_model, fallback="raise", **ours):
                got = _call(harness_model.generate, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            use_cache=True, **opts, **streamer(1))
        else:
            got = _call(specdec_fast.generate, target, batch.input_ids, batch.attention_mask, **ours, **opts, **streamer(1))
        for model, config in zip(models, saved):
            model.generation_config = config
        failure = _compare(expected, got)
        if failure is None and streams and not isinstance(expected, Exception) and streams[0].seen != streams[1].seen:
            failure = f"streamed\n hf:   {streams[0].seen}\n ours: {streams[1].seen}"
        yield it, _described(opts, ours, prompts=batch.input_ids.shape, via_patch=via_patch, streamer=bool(streams),
                             refused=isinstance(got, Exception),
                             route=route, fields=fields if route != "keywords" else None), failure


class Recorder:
    """A streamer that keeps what it was given: the prompt's tokens, the new tokens in order (in
    whatever chunks they came), and how many times it was ended."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1

    @property
    def seen(self) -> tuple:
        return (self.puts[:1], [t for chunk in self.puts[1:] for t in chunk], self.ends)


def sampled_cases(seed: int, iterations: int, triton: bool = False):
    """Yields (case number, description, failure or None): one seeded sampled call on the demo pair
    through every path that must give its tokens. The oracle is bitwise: it holds while the paths' logits
    are equal, and they may differ in their last bits where a path changes the shape of a product -- the
    static twin pads the batch to a captured size, and on CPU a call of up to kernels/linear AUTO_ROWS rows
    takes the C++ skinny_linear, a larger one F.linear (another summation order). A draft whose ratio p / q
    falls within those bits of its uniform is then accepted by one path and rejected by the other: seen once
    (2026-11-30, --seed 777 case 29: batch 3 eager = 6 rows in C++, the twin's 4 = 8 rows in F.linear; logits
    5e-6 apart, p / q 0.6433300 against 0.6433282). Each path still samples the target's distribution
    exactly; such a failure needs that explanation checked before it is called one."""
    import specdec_fast

    tok, target, draft, _ = _demo()
    for it in range(iterations):
        rng = random.Random(seed * 100003 + it)
        batch = tok(rng.sample(GREEDY_PROMPTS, rng.randint(1, 4)), return_tensors="pt", padding=True)
        opts = dict(do_sample=True, pad_token_id=tok.pad_token_id, seed=rng.randrange(2**31),
                    max_new_tokens=rng.randint(1, 40), temperature=rng.choice([0.5, 0.8, 1.0, 1.3]))
        for name, values, chance in (("top_k", [1, 5, 50], 0.4), ("top_p", [0.5, 0.9], 0.4), ("min_p", [0.05, 0.2], 0.2)):
            if rng.random() < chance:
                opts[name] = rng.choice(values)
        if rng.random() < 0.3:
            opts.update(stop_strings=rng.sample(STOP_STRINGS, rng.randint(1, 2)), tokenizer=tok)
        if rng.random() < 0.4:
            opts["eos_token_id"] = tok.eos_token_id
        if rng.random() < 0.15:
            opts["num_return_sequences"] = 2
        # no adaptive schedule: its Ks follow measured times, and so do a seeded call's tokens
        ours = {k: v for k, v in _drafting(rng, draft, tree_ok=True, triton=False, adaptive=False).items()
                if k not in ("backend", "runner", "cuda_graphs")}
        if rng.random() < 0.3:
            opts["repetition_penalty"] = rng.choice([1.05, 1.3])

        def run(**path):
            return _call(specdec_fast.generate, target, batch.input_ids, batch.attention_mask, **ours, **path, **opts)

        compiled = _compiled_cpu_backend()
        base = run(backend=compiled or "torch", runner="paged", cuda_graphs=False)
        paths = {"the cached engine again": dict(backend=compiled or "torch", runner="paged", cuda_graphs=False)}
        if compiled:
            paths.update({"static twin": dict(backend=compiled, runner="paged", cuda_graphs="static"),
                          "torch backend": dict(backend="torch", runner="paged", cuda_graphs=False)})
        if "tree" not in ours:
            paths["hf runner"] = dict(backend=compiled or "torch", runner="hf", cuda_graphs=False)
        if triton and it % 3 == 0:
            paths["triton"] = dict(backend="triton", runner="paged", cuda_graphs="static")
        failures = []
        for name, path in paths.items():
            got = run(**path)
            same = (type(base) is type(got) and str(base) == str(got)) if isinstance(base, Exception) or \
                isinstance(got, Exception) else torch.equal(base, got)
            if not same:
                failures.append(f"{name}: {got!r}" if isinstance(got, Exception) else f"{name}: {got.tolist()}")
        failure = None if not failures else (f"base: {base!r}" if isinstance(base, Exception) else
                                             f"base: {base.tolist()}") + "\n " + "\n ".join(failures)
        yield it, _described(opts, ours, prompts=batch.input_ids.shape, refused=isinstance(base, Exception)), failure


MTP_KINDS = {"glm_mtp": "glm4_moe", "deepseek_mtp": "deepseek_v3", "qwen3_next_mtp": "qwen3_next"}  # the families' kinds with an MTP layer: its model kind


def family_cases(seed: int, iterations: int, triton: bool = False):
    """Yields (case number, description, failure or None) of greedy calls on the tests' tiny models
    with transformers' processors, against model.generate."""
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    import specdec_fast
    from tests.engine.conftest import as_generate_takes
    from tests.engine.models import left_padded_prompts, make_draft, make_model
    from tests.engine.test_generate_processors import OPTIONS, BanEvenAfterOdd
    from tests.engine.mtp_models import glm_with_mtp

    class StopAt(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    pairs = {}
    named = [name for name in OPTIONS if name not in ("logits_processor", "prefix_allowed_tokens_fn")]
    for it in range(iterations):
        rng = random.Random(seed * 100003 + it)
        kind = rng.choice(["llama", "llama", "qwen2", "gpt2", "phi3", "granite", "smollm3", "olmo3", "gemma3", "starcoder2", "gpt_neox", "opt", "cohere", "gpt_bigcode",
                          "mistral", "gemma", "gemma2", "cohere2", "mixtral", "qwen3_moe", "qwen2_moe", "glm4_moe", "exaone_moe", "solar_open",
                          "olmoe", "ministral3", "cwm", "gpt_oss", "glm_mtp", "deepseek_v2", "deepseek_v3", "deepseek_mtp", "qwen3_next", "qwen3_next_mtp", "minimax_m2", "ernie4_5_moe",
                          "llama4_text", "glm4", "exaone4", "hunyuan_v1_moe", "dots1", "apertus", "arcee",
                          "granitemoehybrid", "gemma4_text", "hy_v3", "glm_moe_dsa", "nemotron_h", "granite_h", "falcon_h1", "afmoe",
                          "laguna", "mimo_v2_flash", "olmo_hybrid", "lfm2", "lfm2_moe",
                          "mamba2", "mamba", "falcon_mamba", "jamba", "minimax", "kimi_linear", "lfm3", "youtu", "granite_swa", "gemma4_unified_text", "axk1", "kolibri1", "flint", "vaultgemma", "granitemoe_swa", "helium", "olmo", "flex_olmo", "nemotron", "stablelm", "cohere2_moe", "phimoe",
                          "granitemoe"])
        if kind not in pairs:  # MTP_KINDS: loaded from a checkpoint with its MTP layer (use_mtp below)
            model = glm_with_mtp(tempfile.mkdtemp(prefix=f"fuzz_{kind}_"), kind=MTP_KINDS[kind]) if kind in MTP_KINDS \
                else make_model(kind, layers=2, seed=3)
            if kind == "minimax":  # its attention layer first: transformers 5.24 decodes a left-padded MiniMax batch
                # wrongly where layer 0 is a lightning layer (tests/engine/test_paged_minimax.py)
                model.config.layer_types = sorted(model.config.layer_types)
                torch.manual_seed(3)
                model = type(model)(model.config).float().eval()
            model.generation_config.eos_token_id = None
            pairs[kind] = (model, make_draft(model, noise=0.1))
        target, draft = pairs[kind]
        ids, mask = left_padded_prompts([rng.randint(1, 10) for _ in range(rng.randint(1, 4))], seed=rng.randrange(10**6))
        opts = dict(do_sample=False, pad_token_id=0)
        for name in rng.sample(named, rng.choice([0, 0, 1, 1, 2])):
            opts.update({k: v for k, v in OPTIONS[name].items() if k != "eos_token_id" or k not in opts})
        if rng.random() < 0.3 and "eos_token_id" not in opts:
            opts["eos_token_id"] = rng.randrange(3, 128)
        if rng.random() < 0.5:
            opts["max_new_tokens"] = rng.randint(1, 24)
        else:
            opts["max_length"] = ids.shape[1] + rng.randint(1, 24)
        if rng.random() < 0.15:
            opts["stopping_criteria"] = StoppingCriteriaList([StopAt(rng.randrange(3, 128))])
        if rng.random() < 0.15:
            opts["logits_processor"] = LogitsProcessorList([BanEvenAfterOdd()])
        if rng.random() < 0.25:
            opts.update(return_dict_in_generate=True, output_scores=True)
        # token trees on the recurrent families (their runners' tree rule; the other families' trees: the trees mode)
        ours = _drafting(rng, draft, tree_ok=kind in RECURRENT_KINDS, triton=triton)
        if rng.random() < 0.1:  # the target's own first layer drafts (GPT-2: an UnsupportedModelError)
            ours = {k: v for k, v in ours.items() if k not in DRAFTING_KEYS + ("tree",)}
            ours["assistant_early_exit"] = 1
        if kind in MTP_KINDS and rng.random() < 0.7:  # the target's own MTP layer drafts, K of 1-3 or its default
            ours = {k: v for k, v in ours.items() if k not in DRAFTING_KEYS + ("assistant_early_exit",)}
            ours.update(use_mtp=True, runner="paged",  # the MTP layer reads the paged target runner's states
                        # (a drawn tree stays: the MTP layer expands it; its shape sets the drafts)
                        **({} if rng.random() < 0.3 or "tree" in ours else {"num_assistant_tokens": rng.randint(1, 3)}))
        expected = _call(target.generate, ids, attention_mask=mask, **as_generate_takes(opts))
        got = _call(specdec_fast.generate, target, ids, mask, **ours, **opts)
        yield it, _described(opts, ours, family=kind, lengths=mask.sum(1).tolist(), refused=isinstance(got, Exception)), \
            _compare(expected, got)


def chat_cases(seed: int, iterations: int, triton: bool = False):
    """Yields (case number, description, failure or None): a greedy chat loop on the demo pair, 2-4
    turns over one DynamicCache each side (transformers' multi-turn recipe: input_ids the whole
    conversation so far), ours through generate(cache=...) with a random drafter and options;
    each turn's tokens against model.generate's over its own cache."""
    from transformers import DynamicCache

    import specdec_fast
    from specdec_fast.runners.hf import cache_keyword

    tok, target, draft, _ = _demo()
    for it in range(iterations):
        rng = random.Random(seed * 100003 + it)
        ours = {k: v for k, v in _drafting(rng, draft, tree_ok=False, triton=triton).items() if k != "runner"}
        opts = dict(do_sample=False, pad_token_id=tok.pad_token_id)
        if rng.random() < 0.3:
            opts["repetition_penalty"] = rng.choice([1.05, 1.3])
        if rng.random() < 0.3:
            opts.update(stop_strings=rng.sample(STOP_STRINGS, rng.randint(1, 2)), tokenizer=tok)
        theirs_cache, ours_cache = DynamicCache(config=target.config), DynamicCache(config=target.config)
        conversation = tok(rng.choice(GREEDY_PROMPTS), return_tensors="pt").input_ids
        failure, turns = None, rng.randint(2, 4)
        for turn in range(turns):
            kw = dict(opts, max_new_tokens=rng.randint(1, 24))
            mask = torch.ones_like(conversation)
            expected = _call(target.generate, conversation, attention_mask=mask,
                             **{cache_keyword(target): theirs_cache}, **kw)
            got = _call(specdec_fast.generate, target, conversation, mask, cache=ours_cache, **ours, **kw)
            failure = _compare(expected, got)
            if failure or isinstance(expected, Exception):
                failure = failure and f"turn {turn}: {failure}"
                break
            conversation = torch.cat([expected, tok(rng.choice(GREEDY_PROMPTS), return_tensors="pt").input_ids], 1)
        yield it, _described(opts, ours, turns=turns, refused=isinstance(got, Exception)), failure


def was_refused(description: str) -> bool:
    """Whether the case's call was refused on our side (a case description's "refused")."""
    return json.loads(description)["refused"]


MODES = {"greedy": greedy_cases, "sampled": sampled_cases, "families": family_cases, "chat": chat_cases}


def _families_only(kinds) -> None:
    """--recurrent / --kinds: the families mode draws ``kinds`` alone (in turn, where it would draw among every
    family); a drawn backend is the Triton one two times in three where --triton offers it. For the command line
    only: it patches random.Random.choice for the process."""
    kinds = itertools.cycle(kinds)
    draw = random.Random.choice

    def choice(rng, seq):
        if isinstance(seq, list) and "granitemoe" in seq:  # the families list
            return next(kinds)
        if isinstance(seq, list) and "triton" in seq and rng.random() < 2 / 3:
            return "triton"
        return draw(rng, seq)

    random.Random.choice = choice


def _small_chunks() -> None:
    """--small-chunks: the recurrent layers' prefills in chunks of 4 tokens and groups of two chunks
    (runners/chunked_prefill.py), so the fuzzer's short prompts cross chunks and groups: the carry between them. For
    the command line only: it patches those modules' constants for the process."""
    from specdec_fast.runners import chunked_prefill, kda, lightning, mamba2, paged_qwen3_next

    paged_qwen3_next.PREFILL_CHUNK = mamba2.PREFILL_CHUNK = lightning.CHUNK = kda.CHUNK = 4
    real = chunked_prefill._group_tokens
    chunked_prefill._group_tokens = lambda size, per_chunk_bytes: min(real(size, per_chunk_bytes), 2 * size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="greedy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--triton", action="store_true", help="draw the Triton backend too (interpreted on a CPU: slow)")
    parser.add_argument("--recurrent", action="store_true", help="families mode: the recurrent families alone")
    parser.add_argument("--kinds", help="families mode: these families alone (comma-separated), e.g. a new one's")
    parser.add_argument("--small-chunks", action="store_true",
                        help="the recurrent prefills in chunks of 4 and groups of 2 chunks (short prompts cross them)")
    args = parser.parse_args(argv)
    if args.recurrent or args.kinds:
        if args.mode != "families":
            parser.error("--recurrent and --kinds draw among the families mode's models")
        _families_only(RECURRENT_KINDS if args.recurrent else args.kinds.split(","))
    if args.small_chunks:
        _small_chunks()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    failed = refused = 0
    for it, description, failure in MODES[args.mode](args.seed, args.iterations, args.triton):
        refused += was_refused(description)
        if failure:
            failed += 1
            print(f"FAIL case {it} (--mode {args.mode} --seed {args.seed}): {description}\n {failure}", flush=True)
        if (it + 1) % 25 == 0:
            print(f"{it + 1} cases, {failed} failed", flush=True)
    print(f"{args.mode}: {args.iterations} cases, {failed} failed, {refused} refused by ours (and by transformers or "
          "handed to it)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
