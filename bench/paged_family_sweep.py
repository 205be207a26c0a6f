"""Which of transformers' causal-LM types the paged Llama runner reproduces as they are (the types
with a paged runner already, runners/registry.PAGED_RUNNERS, are listed as SUPPORTED).

    python bench/paged_family_sweep.py              # every type of the installed transformers
    python bench/paged_family_sweep.py gemma exaone # some

For each model type: a tiny random model from its config class (hidden 64, 2 layers, 4 heads, 2
KV heads, head_dim 16, vocab 96), then
  LAYOUT  its layers lack the Llama layer's modules (self_attn.{q,k,v,o}_proj or Phi-3's qkv_proj,
          mlp.{gate,up,down}_proj or gate_up_proj, input_layernorm, post_attention_layernorm, and
          nothing else), or the config names its fields otherwise (BIG) or does not build (BUILD);
  MATCH   PagedLlamaRunner, allowed the type for the run, gives the model's own logits
          (tests/engine/runner_checks.assert_runner_matches_forward: prefill, left-padded score
          calls, rollback; 1e-4);
  FAIL    it does not (other math, or an error naming why).
A MATCH is a lead, not a proof: a random tiny config leaves some features inert (Doge's dynamic
mask, Ministral 3's query scale below original_max_position_embeddings); a type joins
paged_llama.LLAMA_MODEL_TYPES after its modeling code is read and a test of its own passes
(2026-11-30, transformers 5.24: docs/architecture.md, "The Llama-family runner").
CPU only, ~10 minutes for all 196 types on 2 cores (40 s at most a type).
"""
import argparse
import signal
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
             pad_token_id=0, initializer_range=0.15)
LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm",
                  "resid_attn_dropout", "resid_mlp_dropout"}  # Phi-3's dropouts (identities in eval)
SECONDS_A_TYPE = 40


class _TimedOut(Exception):
    pass


def layout_reason(model) -> str | None:
    """Why the model's layers are not the Llama layer's modules, or None."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return "no model.layers"
    layer = layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return "no self_attn / mlp"
    if not (hasattr(attn, "qkv_proj") or all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj"))):
        return "no q/k/v projections"
    if not hasattr(attn, "o_proj"):
        return "no o_proj"
    if not (hasattr(mlp, "gate_up_proj") or all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))):
        return "no gated MLP"
    extra = sorted({name for name, _ in layer.named_children()} - LAYER_CHILDREN)
    if not (hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")):
        return "not the two RMSNorms"
    return f"other modules in the layer: {extra}" if extra else None


def tiny_model(model_type: str):
    """(model, None) or (None, 'BIG ...' / 'BUILD ...')."""
    import transformers as tf

    cls = tf.CONFIG_MAPPING[model_type]
    try:
        config = cls(**SMALL)
    except Exception:  # noqa: BLE001 - a config that takes other fields: set those it has
        config = cls()
        for key, value in SMALL.items():
            if hasattr(config, key):
                setattr(config, key, value)
    if any(getattr(config, key, 10**9) > SMALL[key] for key in ("hidden_size", "num_hidden_layers", "vocab_size")):
        return None, "BIG config (its fields have other names)"
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval(), None


def sweep_one(model_type: str) -> str:
    """'MATCH', 'FAIL ...', 'LAYOUT ...', 'BIG ...' or 'BUILD ...' for one model type."""
    import specdec_fast.runners.paged_llama as paged_llama
    from tests.engine.runner_checks import assert_runner_matches_forward

    try:
        model, why = tiny_model(model_type)
    except Exception as exc:  # noqa: BLE001 - a type that does not build from a small config
        return f"BUILD {type(exc).__name__}: {str(exc)[:120]}"
    if model is None:
        return why
    reason = layout_reason(model)
    if reason is not None:
        return f"LAYOUT {reason}"
    allowed = paged_llama.LLAMA_MODEL_TYPES
    paged_llama.LLAMA_MODEL_TYPES = allowed + (model_type,)
    try:
        runner = paged_llama.PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
        assert_runner_matches_forward(model, runner, model.config.vocab_size)
        return "MATCH"
    except Exception as exc:  # noqa: BLE001 - the finding, reported
        return f"FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    finally:
        paged_llama.LLAMA_MODEL_TYPES = allowed


def main(argv=None) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="default: every causal-LM type of the installed transformers")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore")
    from specdec_fast.runners.registry import PAGED_RUNNERS

    types = args.model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)

    def _alarm(*_):
        raise _TimedOut(f"over {SECONDS_A_TYPE} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    counts = {}
    try:
        for model_type in types:
            if model_type in PAGED_RUNNERS:
                verdict = f"SUPPORTED ({PAGED_RUNNERS[model_type].__name__})"
            else:
                signal.alarm(SECONDS_A_TYPE)
                try:
                    verdict = sweep_one(model_type)
                except _TimedOut as exc:
                    verdict = f"BUILD timed out: {exc}"
                finally:
                    signal.alarm(0)
            counts[verdict.split()[0]] = counts.get(verdict.split()[0], 0) + 1
            print(f"{model_type}: {verdict}", flush=True)
    finally:
        signal.signal(signal.SIGALRM, previous)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
