"""Model presets (`data/models.yaml`) and Hugging Face `config.json` files, as the facts the
config's `model:` block needs. Pure data: no network, no ML libraries."""

from __future__ import annotations

import difflib
import json
import math
import os
import stat
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

# The `model:` fields a preset or a config.json can fill ...
ARCH_FIELDS = ("params_b", "dtype", "layers", "attention_heads", "kv_heads", "head_dim",
               "hidden_size", "experts", "experts_per_token", "active_params_b")
# ... and of them those a model may lack: a dense model has no experts; without
# hidden_size the serving model takes attention_heads x head_dim.
# The keys of a mixture of experts, given together or not at all.
MOE_FIELDS = ("experts", "experts_per_token", "active_params_b")
OPTIONAL_FIELDS = ("attention_heads", "hidden_size", *MOE_FIELDS)
# Refuse anything larger: a config.json is a few KB, and this one is read during validation.
MAX_CONFIG_JSON_BYTES = 1 * 2**20
# No width, count or vocabulary of a real model comes near this; a larger integer is not a
# model's (and would overflow the float arithmetic of estimate_params).
MAX_CONFIG_INT = 2**31


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Hugging Face model id.")
    params_b: float = Field(gt=0, description="Total parameters in billions (all experts).")
    layers: int = Field(gt=0, description="num_hidden_layers.")
    attention_heads: int = Field(gt=0, description="num_attention_heads (query heads).")
    kv_heads: int = Field(gt=0, description="num_key_value_heads.")
    head_dim: int = Field(gt=0, description="head_dim, or hidden_size / num_attention_heads.")
    hidden_size: int = Field(gt=0, description="hidden_size: the width the all-reduce moves.")
    experts: int | None = Field(
        default=None, gt=1, description="Routed experts per MoE layer (num_experts, "
        "num_local_experts or n_routed_experts); null for a dense model.")
    experts_per_token: int | None = Field(
        default=None, gt=0, description="num_experts_per_tok: experts each token is routed to.")
    active_params_b: float | None = Field(
        default=None, gt=0, description="Parameters one token computes with (the card's "
        "'activated' figure): shared layers, shared experts and experts_per_token experts.")
    dtype: str = Field(description="Native weight dtype of the checkpoint.")
    max_context: int = Field(gt=0, description="max_position_embeddings.")
    source: str = Field(description="The config.json the numbers were read from.")
    card: str = Field(description="The model card (for params_b).")

    def kv_elements_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim


@cache
def load_presets() -> dict[str, Preset]:
    text = resources.files("poolctl.data").joinpath("models.yaml").read_text()
    rows = [Preset.model_validate(r) for r in yaml.safe_load(text)["models"]]
    return {r.id: r for r in rows}


def preset(model_id: str) -> Preset | None:
    """The preset of `model_id`; Hugging Face ids are case-insensitive."""
    presets = load_presets()
    if model_id in presets:
        return presets[model_id]
    folded = {k.lower(): v for k, v in presets.items()}
    return folded.get(model_id.lower())


def did_you_mean(word: str, choices: list[str]) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def suggest_model(model_id: str) -> str:
    """The closest preset id, comparing whole ids and the names after the org."""
    ids = list(load_presets())
    hint = did_you_mean(model_id, ids)
    if not hint:
        names = {i.split("/")[-1]: i for i in ids}
        close = difflib.get_close_matches(model_id.split("/")[-1].lower(),
                                          [n.lower() for n in names], n=1, cutoff=0.5)
        if close:
            full = next(v for k, v in names.items() if k.lower() == close[0])
            hint = f" (did you mean {full!r}?)"
    return hint


# torch_dtype values of config.json, to poolctl dtypes.
_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
                 "fp16": "float16", "bf16": "bfloat16"}
_QUANT_DTYPES = {"fp8": "fp8", "mxfp4": "mxfp4"}


def _int(cfg: dict[str, Any], key: str) -> int | None:
    """A positive integer of config.json (read_hf_config refuses larger ones than
    MAX_CONFIG_INT first)."""
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


# The integers estimate_params and read_hf_config read.
_INT_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "num_experts", "num_local_experts",
             "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
             "moe_intermediate_size", "intermediate_size", "shared_expert_intermediate_size")


def _experts(cfg: dict[str, Any]) -> int | None:
    """Routed experts per layer, under the names Qwen-MoE, Mixtral and DeepSeek use."""
    return _int(cfg, "num_experts") or _int(cfg, "num_local_experts") or \
        _int(cfg, "n_routed_experts")


def estimate_params(cfg: dict[str, Any], active: bool = False) -> float | None:
    """Parameters (billions) of a decoder-only transformer with a gated MLP (Llama, Qwen,
    Mistral; Mixtral/Qwen-MoE experts), from config.json; None if a needed key is missing.
    Biases and q/k norms are left out (under 0.1 %); embeddings count twice unless
    tie_word_embeddings is true. Checked against Llama-3.1-8B: 8.03 B as its card says, and
    Qwen3-30B-A3B: 30.5 B total, 3.3 B active. `active`: the parameters one token computes
    with (num_experts_per_tok experts of each MoE layer, plus shared experts)."""
    h, layers, vocab = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers"), \
        _int(cfg, "vocab_size")
    heads = _int(cfg, "num_attention_heads")
    if not (h and layers and vocab and heads):
        return None
    kv = _int(cfg, "num_key_value_heads") or heads
    hd = _int(cfg, "head_dim") or h // heads
    experts = _experts(cfg)
    # Qwen-MoE names its expert width moe_intermediate_size; Mixtral uses intermediate_size
    inter = (experts and _int(cfg, "moe_intermediate_size")) or _int(cfg, "intermediate_size")
    if not inter:
        return None
    attn = h * heads * hd * 2 + h * kv * hd * 2  # q and o, k and v
    used = experts
    if experts and active:
        used = min(experts, _int(cfg, "num_experts_per_tok") or experts)
    mlp = 3 * h * inter * (used or 1) + (h * experts if experts else 0)  # + router
    if experts:  # shared experts (Qwen2-MoE's one wide one, DeepSeek's n_shared_experts)
        mlp += 3 * h * (_int(cfg, "shared_expert_intermediate_size")
                        or inter * (_int(cfg, "n_shared_experts") or 0))
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return round((layers * (attn + mlp + 2 * h) + embed + h) / 1e9, 2)


def read_hf_config(path: Path, shown: str | None = None) -> dict[str, Any]:
    """The `model:` fields a Hugging Face config.json gives, or ValueError with the reason
    (naming the file as `shown`, the path as the user wrote it). params_b is estimated from
    the shapes (see estimate_params) unless it cannot be."""
    name = shown or str(path)
    try:
        # O_NONBLOCK: a FIFO swapped in after a check would block the open; fstat then says
        # what was opened, and only a regular file is read (not /dev/stdin, not a FIFO).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"{name} cannot be read ({e.strerror}); check the path") from None
    except ValueError:  # a NUL in the path (the config refuses those first)
        raise ValueError(f"{name} is not a usable path; check it") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{name} is not a regular file; point it at the model's "
                             "config.json")
        raw = fh.read(MAX_CONFIG_JSON_BYTES + 1)
    if len(raw) > MAX_CONFIG_JSON_BYTES:
        raise ValueError(f"{name} is over 1 MiB, not a model config.json")
    try:
        cfg = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(f"{name} is not JSON; point it at the model's config.json") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{name} is not a JSON object; point it at the model's config.json")
    text_config = cfg.get("text_config")
    if isinstance(text_config, dict):
        cfg = text_config
    for key in _INT_KEYS:
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_CONFIG_INT:
            shown_v = f"{v}" if abs(v) < 10**30 else "an integer of over 30 digits"
            raise ValueError(f"{name}: {key} is {shown_v}, past any model's; point it at the "
                             "model's config.json")
    if "kv_lora_rank" in cfg:
        # multi-head latent attention caches a compressed latent, not kv_heads x head_dim
        raise ValueError(f"{name} is a multi-head latent attention model (DeepSeek-V2/V3 "
                         "style), whose KV cache poolctl does not model; not supported")
    heads = _int(cfg, "num_attention_heads")
    hidden = _int(cfg, "hidden_size")
    experts = _experts(cfg)
    out: dict[str, Any] = {
        "layers": _int(cfg, "num_hidden_layers"),
        "attention_heads": heads,
        "kv_heads": _int(cfg, "num_key_value_heads") or heads,
        "head_dim": _int(cfg, "head_dim") or (hidden // heads if heads and hidden else None),
        "hidden_size": hidden,
        "params_b": estimate_params(cfg),
    }
    if experts and experts > 1:
        out["experts"] = experts
        out["experts_per_token"] = _int(cfg, "num_experts_per_tok")
        out["active_params_b"] = estimate_params(cfg, active=True)
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        out["dtype"] = _QUANT_DTYPES.get(str(quant.get("quant_method")))
    else:
        out["dtype"] = _TORCH_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")))
    return {k: v for k, v in out.items() if v is not None and not (
        isinstance(v, float) and not math.isfinite(v))}
