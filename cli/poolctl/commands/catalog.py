"""catalog: the instance types and model presets poolctl knows, with the facts rules use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from poolctl.catalog import load_catalog
from poolctl.commands.common import CloudAllOpt, JsonOpt, cloud_value, console, emit_json
from poolctl.models import load_presets

if TYPE_CHECKING:
    from poolctl.catalog import InstanceType


def catalog(cloud: CloudAllOpt = None, json_out: JsonOpt = False) -> None:
    """Instance types (GPUs, HBM, NVLink, NVMe, vCPU, price, quota) and model presets."""

    want = cloud_value(cloud)
    rows = [r for r in load_catalog().instance_types if want in (None, r.cloud)]
    presets = list(load_presets().values())
    if json_out:
        emit_json({
            "instance_types": [_type_json(r) for r in rows],
            "models": [p.model_dump() | {"kv_bytes_per_token_bf16": 2 * p.kv_elements_per_token()}
                       for p in presets],
        })
        return

    out = console()
    t = Table(title="Instance types (pools need an 8-GPU NVLink type)", title_justify="left")
    for col in ("cloud", "type", "GPUs", "HBM/GPU", "NVLink", "local NVMe", "vCPU",
                "USD/h (date)", "quota"):
        t.add_column(col)
    for r in rows:
        nvme = r.local_nvme
        t.add_row(r.cloud, r.name, f"{r.gpus}x {r.gpu}", f"{r.hbm_mib_per_gpu / 1024:.0f} GiB",
                  "yes" if r.nvlink else "no",
                  f"{nvme.count}x {nvme.size_gb:g} GB" if nvme.count else "-",
                  str(r.vcpus), f"{r.price.usd_per_hour:,.2f} ({r.price.date})",
                  f"{r.quota.name} ({r.quota.unit})")
    out.print(t)
    m = Table(title="Model presets (`model: {id: ...}` is enough; fields given override)",
              title_justify="left")
    for col in ("id", "params", "dtype", "layers", "heads / KV", "head dim", "max context",
                "KV/token"):
        m.add_column(col)
    for p in presets:
        m.add_row(p.id, f"{p.params_b:g} B", p.dtype, str(p.layers),
                  f"{p.attention_heads} / {p.kv_heads}", str(p.head_dim), f"{p.max_context:,}",
                  f"{2 * p.kv_elements_per_token() // 1024} KiB (bf16)")
    out.print(m)


def _type_json(r: InstanceType) -> dict[str, Any]:
    return {
        "cloud": r.cloud, "name": r.name, "gpu": r.gpu, "gpus": r.gpus,
        "hbm_mib_per_gpu": r.hbm_mib_per_gpu, "hbm_tbps_per_gpu": r.hbm_tbps_per_gpu,
        "nvlink": r.nvlink, "local_nvme": r.local_nvme.model_dump(), "vcpus": r.vcpus,
        "ram_gib": r.ram_gib, "price": r.price.model_dump(), "quota": r.quota.model_dump(),
        "regions": sorted(r.regions), "pool_capable": r.nvlink and r.gpus == 8,
    }
