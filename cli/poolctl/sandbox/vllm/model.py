"""The replica the stand-in serves as: poolctl's serving model of the container's model on the
node's GPUs, worked out by the same rule `plan` and `simulate` use (servingmodel.replica_model)
from what a vLLM server knows: its flags, the model folder's config.json (or poolctl's preset
of the served name) and the node's instance type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.errors import UsageError
from poolctl.models import read_hf_config
from poolctl.sandbox.vllm.flags import ServeArgs, known_flags
from poolctl.servingmodel import ReplicaModel, replica_model

# vLLM's defaults where the line is silent (v0.11, V1 engine on a GPU of the catalog's class).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_MODEL_LEN = 32768  # when the folder has no config.json (a preset by name)

_DTYPES = {"fp8": "fp8", "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}


def _context_length(cfg: Path) -> int:
    """vLLM's default --max-model-len: the model's own context (max_position_embeddings)."""
    try:
        n = json.loads(cfg.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        n = None
    return n if isinstance(n, int) and n > 0 else DEFAULT_MAX_MODEL_LEN


def serving_model(args: ServeArgs, instance_type: str,
                  facts: dict[str, Any] | None = None) -> ReplicaModel:
    """The replica model, or UsageError naming what the stand-in cannot serve. `facts`: the
    pool's `model:` fields as poolctl resolved them (the sandbox passes them, so that the
    engine serves as `simulate` models the pool); else the folder's config.json, else
    poolctl's preset of the served name."""
    model: dict[str, Any] = {"id": args.model_name}
    cfg = Path(args.model) / "config.json"
    if facts:
        model.update({k: v for k, v in facts.items() if k != "id"})
    elif cfg.is_file():
        try:
            model.update(read_hf_config(cfg))
        except ValueError as e:
            raise UsageError(f"--model: {e}") from None
    if args.quantization in _DTYPES:
        model["dtype"] = _DTYPES[args.quantization]
    elif args.dtype in _DTYPES:
        model["dtype"] = _DTYPES[args.dtype]
    serving: dict[str, Any] = {
        "image": f"vllm/vllm-openai:v{known_flags()[0]}",
        "tensor_parallel": args.tensor_parallel_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_batched_tokens": args.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_num_seqs": args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        "prefix_caching": args.enable_prefix_caching,
    }
    serving["max_model_len"] = args.max_model_len or _context_length(cfg)
    if args.kv_cache_dtype.startswith("fp8"):
        serving["kv_cache_dtype"] = "fp8"
    doc = {"project": "sandbox", "pools": [{
        "name": "node", "model": model, "serving": serving,
        "scaling": {"min_replicas": 1, "max_replicas": 64},
        "aws": {"region": "us-east-1", "instance_type": instance_type,
                "weights_uri": "s3://sandbox/weights/"}}]}
    try:
        pool = parse_config(json.dumps(doc), "the container's arguments").pools[0]
    except UsageError as e:
        raise UsageError(f"cannot serve {args.model_name} on {instance_type}: {e}") from None
    return replica_model(pool, Cloud.aws)
