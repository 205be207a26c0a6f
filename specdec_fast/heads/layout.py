"""load_draft_head / save_draft_head: draft heads in their published checkpoint layouts.

A head directory holds config.json and its weights as model.safetensors (or sharded with
model.safetensors.index.json) or pytorch_model.bin (a torch state dict). config.json's
``architectures`` picks the kind:
    LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM   EAGLE-3 (heads/eagle3.py: SafeAILab/EAGLE's
                                                      names, as SGLang and vLLM load them)
    DFlashDraftModel                                  DFlash block drafter (heads/dflash.py)
    DFlash2DraftModel                                 DFlash2: DFlash + in-block convolution + candidate
                                                      selector (heads/dflash2.py)
Weight names are taken as the EAGLE repo writes them (fc.weight, midlayer.*, norm.weight,
lm_head.weight, d2t, t2d); the variants SGLang / vLLM also accept are mapped to them: a leading
"model." and "layers.0." for "midlayer.". embed_tokens.weight is optional (the target's
embedding otherwise); lm_head.weight may be absent when tie_word_embeddings is set (then the
draft vocabulary is the target's and lm_head is the embedding).
"""
import json
import weakref
from pathlib import Path

import torch

from .dflash import DFLASH_ARCHITECTURES, dflash_from_layout
from .dflash2 import DFLASH2_ARCHITECTURES, dflash2_from_layout
from .eagle3 import EAGLE3_ARCHITECTURES, Eagle3Head
from .mtp import MtpHead
from .gemma4_assistant import Gemma4AssistantHead, is_gemma4_assistant
from .mtp_checkpoint import CheckpointMtpModel
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_FROM_MODULES = weakref.WeakKeyDictionary()  # a loaded checkpoint module -> its head (a copy of its weights)


def is_draft_head(obj) -> bool:
    """A head object this package drafts with (what load_draft_head returns)."""
    return isinstance(obj, torch.nn.Module) and getattr(obj, "kind", None) in ("eagle3", "dflash", "mtp",
                                                                              "gemma4_assistant")


def load_draft_head(source, *, device=None, dtype=None):
    """A draft head from ``source``: a directory in a published layout (module docstring), a head
    object (returned as it is), or the same checkpoint already loaded as a torch module with a
    ``config`` (transformers' AutoModel with trust_remote_code, as transformers' own DFlash
    assisted generation takes it: its config and state_dict are the layout's config.json and
    weights), or transformers' MtpModel of a target (MtpModel.from_pretrained(target); for Qwen3-Next /
    Qwen3.5, heads/mtp_checkpoint.CheckpointMtpModel.from_checkpoint): its MTP
    layer as an MtpHead, heads/mtp.py, its weights shared; an MTP head has no directory layout of
    its own: the layer ships inside the target's checkpoint). device / dtype: where and in which
    dtype the weights go (default: the CPU, the checkpoint's dtype; a loaded module: its own
    device and dtype)."""
    if is_draft_head(source):
        return source if device is None and dtype is None else source.to(device=device, dtype=dtype)
    if isinstance(source, torch.nn.Module):
        if device is None and dtype is None and source in _FROM_MODULES:
            return _FROM_MODULES[source]
        if is_gemma4_assistant(source):  # Gemma 4's assistant: it drafts over the target's K/V (heads/gemma4_assistant.py)
            if device is not None or dtype is not None:
                raise ValueError("a Gemma 4 assistant drafts on its own device and dtype (load it where the target is)")
            head = _FROM_MODULES[source] = Gemma4AssistantHead(source)
            return head
        # transformers' MtpModel of a target, or this package's reading of Qwen's: its layer, shared (heads/mtp.py)
        if type(source).__name__ == "MtpModel" or isinstance(source, CheckpointMtpModel):
            if device is not None or dtype is not None:
                raise ValueError("an MtpModel drafts on its own device and dtype (it shares the target's embedding)")
            head = _FROM_MODULES[source] = MtpHead(source)
            return head
        if not hasattr(getattr(source, "config", None), "to_dict"):
            raise ValueError(f"a {type(source).__name__} without a transformers config is no draft head checkpoint")
        weights = dict(source.state_dict())
        first = next(iter(weights.values()), None)
        head = _from_layout(source.config.to_dict(), weights, f"{type(source).__name__}.config",
                            device or (None if first is None else first.device),
                            dtype or (None if first is None else first.dtype))
        if device is None and dtype is None:  # one head per module: the engine cached for it serves every call
            _FROM_MODULES[source] = head
        return head
    path = Path(source)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no draft head at {path}: a head directory holds config.json and its weights")
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return _from_layout(raw, _read_weights(path), f"{path}/config.json", device, dtype)


def _from_layout(raw: dict, weights: dict, where: str, device, dtype):
    """The head of a layout's config (a dict) and weights (name -> tensor), on device / dtype."""
    architectures = raw.get("architectures") or []
    if any(a in EAGLE3_ARCHITECTURES for a in architectures):
        head = _eagle3(raw, weights)
    elif any(a in DFLASH2_ARCHITECTURES for a in architectures):
        head = dflash2_from_layout(raw, weights)
    elif any(a in DFLASH_ARCHITECTURES for a in architectures):
        head = dflash_from_layout(raw, weights)
    else:
        raise ValueError(f"{where}: architectures {architectures} name no draft head this package loads "
                         f"({', '.join(EAGLE3_ARCHITECTURES + DFLASH_ARCHITECTURES + DFLASH2_ARCHITECTURES)})")
    head.eval().requires_grad_(False)
    stored = raw.get("torch_dtype") or raw.get("dtype")
    if dtype is None and isinstance(stored, str) and stored in ("float16", "bfloat16", "float32"):
        dtype = getattr(torch, stored)
    return head.to(device=device or "cpu", dtype=dtype)


def save_draft_head(head, directory, *, safetensors: bool = True) -> None:
    """Writes ``head`` in its published layout: config.json + model.safetensors (or
    pytorch_model.bin). The target's embedding is not written (embed_tokens only when the head
    has its own)."""
    if getattr(head, "kind", None) == "mtp":
        raise ValueError("an MTP head is a layer of its target's checkpoint (model.layers.{L}); it has no layout of its own")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config["architectures"] = [head.architecture]
    causal = set(getattr(head, "layer_causal", ()))
    if len(causal) == 1 and "is_causal" not in config:
        # a block drafter's layers all causal or all not: said outright, so that a reader that infers it
        # from the layer types (z-lab's reference: sliding layers causal) reads what this head runs
        config["is_causal"] = causal.pop()
    dtype = next(head.parameters()).dtype
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, out / "pytorch_model.bin")


def _read_weights(path: Path) -> dict:
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    if (path / "model.safetensors.index.json").is_file():
        from safetensors.torch import load_file

        index = json.loads((path / "model.safetensors.index.json").read_text(encoding="utf-8"))
        weights = {}
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(load_file(str(path / shard)))
        return weights
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no weights under {path} (one of {', '.join(WEIGHT_FILES)})")


def _canonical(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def _eagle3(raw: dict, weights: dict) -> Eagle3Head:
    from transformers import LlamaConfig

    config = LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    config.architectures = list(raw.get("architectures") or [EAGLE3_ARCHITECTURES[0]])
    weights = {_canonical(name): tensor for name, tensor in weights.items()}
    embed = weights.pop("embed_tokens.weight", None)
    if "lm_head.weight" not in weights and getattr(config, "tie_word_embeddings", False):
        if getattr(config, "draft_vocab_size", None) not in (None, config.vocab_size):
            raise ValueError("a tied lm_head needs draft_vocab_size == vocab_size")
        if embed is None:
            raise ValueError("tie_word_embeddings without embed_tokens.weight: the head's lm_head is not in the checkpoint")
        weights["lm_head.weight"] = embed
    head = Eagle3Head(config, embed_tokens=None if embed is None else torch.nn.Embedding.from_pretrained(embed))
    if "t2d" not in weights and "d2t" in weights:  # t2d follows from d2t
        t2d = torch.zeros(head.vocab_size, dtype=torch.bool)
        t2d[torch.arange(weights["d2t"].numel()) + weights["d2t"].long()] = True
        weights["t2d"] = t2d
    state = head.state_dict()
    missing = sorted(set(state) - set(weights) - {"d2t", "t2d"} - {n for n in state if n.startswith("embed_tokens.")})
    unexpected = sorted(set(weights) - set(state))
    if missing or unexpected:
        raise ValueError(f"EAGLE-3 weights do not fit the layout: missing {missing}, unexpected {unexpected}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(f"EAGLE-3 weight {name}: shape {tuple(tensor.shape)}, the config says {tuple(state[name].shape)}")
    head.load_state_dict({**state, **{n: t.to(state[n].dtype) for n, t in weights.items()}})
    return head
