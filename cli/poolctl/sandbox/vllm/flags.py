"""`vllm serve`'s command line as the stand-in engine reads it: every flag vLLM has is accepted
(data/vllm_serve_flags.yaml), the ones that shape serving are kept, and any other is refused
as vLLM's parser refuses it (usage error, exit 2)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import yaml

PROG = "vllm serve"


class FlagError(Exception):
    """The command line is not one vLLM would start with (argparse's message)."""


@dataclass(frozen=True)
class ServeArgs:
    """What the stand-in serves with; vLLM's defaults where the line says nothing."""

    model: str
    served_model_names: tuple[str, ...]
    port: int = 8000
    host: str = "0.0.0.0"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    api_keys: tuple[str, ...] = ()
    block_size: int = 16
    # --custom-histogram-buckets (vLLM >= 0.32): a family's edges replacing vLLM's
    histogram_buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)
    others: dict[str, str | bool] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


@cache
def known_flags() -> tuple[str, dict[str, str]]:
    """(vLLM version, flag -> kind) from the catalog."""
    raw = yaml.safe_load(resources.files("poolctl.data").joinpath("vllm_serve_flags.yaml")
                         .read_text())
    return str(raw["version"]), {str(k): str(v) for k, v in raw["flags"].items()}


def _int(flag: str, v: str, low: int = 1) -> int:
    try:
        n = int(v)
    except ValueError:
        raise FlagError(f"argument --{flag}: invalid int value: '{v}'") from None
    if n < low:
        raise FlagError(f"argument --{flag}: must be at least {low}, got {n}")
    return n


def _float(flag: str, v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise FlagError(f"argument --{flag}: invalid float value: '{v}'") from None
    if not math.isfinite(x) or not 0 < x <= 1:
        raise FlagError(f"argument --{flag}: must be in (0, 1], got {v}")
    return x


# vLLM's histogram families (vllm/v1/metrics/buckets.py BucketFamilyKey, v0.32 on).
BUCKET_FAMILIES = ("request_latency", "time_to_first_token", "inter_token_latency",
                   "iteration_tokens", "request_params_n", "request_num_preemptions",
                   "request_tokens", "kv_cache_residency")


def _histogram_buckets(v: str) -> dict[str, tuple[float, ...]]:
    """--custom-histogram-buckets as vLLM's ObservabilityConfig validates it
    (vllm/config/observability.py): a JSON mapping of a known family to strictly increasing,
    positive, finite edges."""
    what = "custom_histogram_buckets"
    try:
        raw = json.loads(v)
    except ValueError:
        raise FlagError(f"argument --custom-histogram-buckets: invalid loads value: '{v}'"
                        ) from None
    if not isinstance(raw, dict):
        raise FlagError(f"{what}: expected a JSON mapping of family to bucket list")
    out: dict[str, tuple[float, ...]] = {}
    for family, edges in raw.items():
        if family not in BUCKET_FAMILIES:
            raise FlagError(f"{what}: unknown bucket family {family!r}; known families: "
                            f"{sorted(BUCKET_FAMILIES)}")
        if not isinstance(edges, list) or not edges:
            raise FlagError(f"{what}[{family!r}]: bucket list must not be empty")
        if not all(isinstance(e, int | float) and not isinstance(e, bool)
                   and math.isfinite(e) and e > 0 for e in edges):
            raise FlagError(f"{what}[{family!r}]: bounds must be positive finite numbers")
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise FlagError(f"{what}[{family!r}]: bounds must be strictly increasing")
        out[family] = tuple(float(e) for e in edges)
    return out


def parse(argv: list[str]) -> ServeArgs:
    """`vllm serve [MODEL] --flag value ...` (the image's entrypoint takes the flags only;
    `--model` or a leading positional names the model). FlagError names the first problem."""
    _, kinds = known_flags()
    values: dict[str, str | bool] = {}
    lists: dict[str, list[str]] = {}
    positional: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--"):
            positional.append(a)
            continue
        name, eq, inline = a[2:].partition("=")
        neg = name.startswith("no-") and kinds.get(name[3:]) == "bool"
        kind = "negated" if neg else kinds.get(name)
        if kind is None:
            unknown.append(a)
            continue
        if kind in ("bool", "switch", "negated"):
            if eq:
                raise FlagError(f"argument --{name}: ignored explicit argument '{inline}'")
            values[name[3:] if neg else name] = not neg
            continue
        if eq:
            got = [inline]
        else:
            got = []
            while i < len(argv) and not argv[i].startswith("--"):
                got.append(argv[i])
                i += 1
                if kind == "value":
                    break
        if not got:
            raise FlagError(f"argument --{name}: expected "
                            f"{'one argument' if kind == 'value' else 'at least one argument'}")
        if kind == "list":
            lists[name] = got
        else:
            values[name] = got[0]
    if len(positional) > 1 or unknown:
        extra = positional[1:] + unknown
        raise FlagError(f"unrecognized arguments: {' '.join(extra)}")
    model = str(values.pop("model", positional[0] if positional else ""))
    if not model:
        raise FlagError("the following arguments are required: model (or --model)")

    def num(flag: str, low: int = 1) -> int | None:
        v = values.pop(flag, None)
        return None if v is None else _int(flag, str(v), low)

    gmu = values.pop("gpu-memory-utilization", None)
    args = ServeArgs(
        model=model,
        served_model_names=tuple(lists.pop("served-model-name", [model])),
        port=num("port", 0) or 8000,
        host=str(values.pop("host", "0.0.0.0")),
        tensor_parallel_size=num("tensor-parallel-size") or 1,
        data_parallel_size=num("data-parallel-size") or 1,
        max_model_len=num("max-model-len"),
        gpu_memory_utilization=(0.9 if gmu is None
                                else _float("gpu-memory-utilization", str(gmu))),
        max_num_batched_tokens=num("max-num-batched-tokens"),
        max_num_seqs=num("max-num-seqs"),
        enable_prefix_caching=bool(values.pop("enable-prefix-caching", True)),
        kv_cache_dtype=str(values.pop("kv-cache-dtype", "auto")),
        dtype=str(values.pop("dtype", "auto")),
        quantization=(None if (q := values.pop("quantization", None)) is None else str(q)),
        api_keys=tuple(lists.pop("api-key", [])),
        block_size=num("block-size") or 16,
        histogram_buckets=(_histogram_buckets(str(b)) if (b := values.pop(
            "custom-histogram-buckets", None)) is not None else {}),
        others=values,
    )
    return args
