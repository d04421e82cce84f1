"""The catalog of 8-GPU instance / machine types, as data (`data/instance_types.yaml`).

Each row names its sources. Rules and sizing read rows from here; nothing else hard-codes a
GPU count, an HBM size or a price.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from poolctl.cloud import Cloud


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalNvme(_Row):
    count: int = Field(ge=0, description="Local NVMe / Local SSD devices per node.")
    size_gb: float = Field(ge=0, description="Size of one device in GB (10^9 bytes).")
    bundled: bool = Field(
        default=True, description="Comes with the type (AWS instance store, bundled GCP SSDs)."
    )

    @property
    def total_bytes(self) -> float:
        return self.count * self.size_gb * 1e9


class Rdma(_Row):
    kind: Literal["none", "efa", "gpudirect-tcpx", "gpudirect-tcpxo", "rdma"] = Field(
        description="The GPU-to-GPU network NICs the type can carry (inference leaves them off)."
    )
    max_interfaces: int = Field(default=0, ge=0, description="How many such NICs at most.")


class VpcNetwork(_Row):
    """IP bandwidth between two nodes without EFA (plain ENA on the primary network card)."""

    instance_gbps: float = Field(
        gt=0, description="Gbit/s the primary network card carries (each way): a node's ENA "
        "bandwidth without the EFA/RDMA cards inference pools leave off.")
    flow_gbps: float = Field(
        gt=0, description="Gbit/s of one TCP flow between nodes outside a cluster placement "
        "group.")
    source: str = Field(description="Where both figures come from.")


class Quota(_Row):
    name: str = Field(description="Quota code (AWS) or metric (GCP) the type counts against.")
    description: str = Field(description="Human name of the quota.")
    unit: Literal["vCPU", "GPU"] = Field(description="What the quota counts.")


class Price(_Row):
    usd_per_hour: float = Field(gt=0, description="On-demand price of one node.")
    region: str = Field(description="Region the price is for.")
    date: str = Field(description="When the price was read (YYYY-MM).")
    source: str = Field(description="Where it was read.")


class Power(_Row):
    max_kw: float = Field(gt=0, description="Maximum power draw of one node, kW.")
    source: str = Field(description="Where the figure comes from (a primary source).")


class InstanceType(_Row):
    name: str
    cloud: Literal["aws", "gcp"]
    gpu: str = Field(description="GPU model.")
    gpus: int = Field(gt=0)
    hbm_mib_per_gpu: int = Field(gt=0)
    hbm_tbps_per_gpu: float = Field(gt=0, description="Peak HBM bandwidth per GPU, TB/s.")
    nvlink: bool
    vcpus: int = Field(gt=0)
    ram_gib: float = Field(gt=0)
    local_nvme: LocalNvme
    rdma: Rdma
    network_gbps: float = Field(gt=0, description="Node network bandwidth, Gbit/s.")
    vpc: VpcNetwork | None = Field(
        default=None, description="VPC (non-RDMA) bandwidth between nodes; null: not sourced.")
    quota: Quota
    price: Price
    regions: dict[str, list[str]] = Field(
        description="Regions offering the type, each with its zones (empty list: not tracked)."
    )
    sources: list[str] = Field(min_length=1)
    notes: str = ""
    power: Power | None = Field(
        default=None, description="Maximum system power of one node (null: no primary source).")

    @property
    def hbm_bytes_per_gpu(self) -> int:
        return self.hbm_mib_per_gpu * 2**20

    @property
    def quota_per_node(self) -> int:
        return self.vcpus if self.quota.unit == "vCPU" else self.gpus


class ServingFactors(_Row):
    """The serving model's efficiency factors for one GPU type and TP (poolctl.servingmodel)."""

    prefill_mfu: float = Field(gt=0, le=1, description="Share of peak FLOPs prefill reaches.")
    decode_mbu: float = Field(gt=0, le=1, description="Share of peak HBM bandwidth decode reaches.")
    step_overhead_ms: float = Field(ge=0, description="Fixed time of every engine step, ms.")
    decode_us_per_seq: float = Field(
        ge=0, description="Time per decoding sequence per step beyond its KV reads, us.")
    link_efficiency: float = Field(
        gt=0, le=1, description="Share of the NVLink/PCIe bandwidth the all-reduce reaches.")
    allreduce_us: float = Field(ge=0, description="Fixed latency of one all-reduce, us.")
    overlap_k: float = Field(
        ge=1, description="How compute and memory time combine in a step: (c^k + m^k)^(1/k); "
        "1 adds them, large k takes the larger (the roofline).")


class EngineFit(_Row):
    """The engine's time per step outside the GPU kernels, fitted to measured end-to-end
    serving runs (the kernel database leaves it out): added to `by_tp`'s kernel terms."""

    step_ms: float = Field(ge=0, description="Per step, ms.")
    us_per_seq: float = Field(ge=0, description="Per running sequence per step, us.")
    mfu_scale: dict[str, float] = Field(
        default_factory=dict, description="Per weight dtype: the share of the BF16-fitted "
        "prefill_mfu its kernels reach of their own peak (FP8 GEMMs fall short of twice BF16).")
    source: str = Field(description="The measured runs, their versions, and the script.")
    runs: int = Field(gt=0, description="How many runs the fit used.")


class ServingFit(_Row):
    """Default factors fitted to a measured database, per tensor-parallel degree."""

    source: str = Field(description="What the factors were fitted to, and by which script.")
    package: str = Field(description="The database's package and version (name==version).")
    by_tp: dict[int, ServingFactors] = Field(
        min_length=1, description="Factors per TP; a TP not listed takes the next lower one's.")
    engine: EngineFit | None = Field(
        default=None, description="Engine time per step, fitted to measured serving runs.")

    def for_tp(self, tp: int) -> ServingFactors:
        return factors_for_tp(self.by_tp, tp)


def factors_for_tp(by_tp: dict[int, ServingFactors], tp: int) -> ServingFactors:
    """The factors of `tp`, else of the next lower TP listed (the lowest if none is)."""
    lower = [t for t in by_tp if t <= tp]
    return by_tp[max(lower) if lower else min(by_tp)]


class GpuSpec(_Row):
    """Per-GPU compute and interconnect, for the serving model (dense tensor-core peaks)."""

    bf16_tflops: float = Field(gt=0, description="Peak dense BF16/FP16 tensor TFLOPS.")
    fp8_tflops: float | None = Field(
        default=None, gt=0, description="Peak dense FP8 TFLOPS; null without FP8 tensor cores."
    )
    fp4_tflops: float | None = Field(
        default=None, gt=0, description="Peak dense FP4 TFLOPS (MXFP4, NVFP4); null without "
        "FP4 tensor cores.")
    nvlink_gbytes_s: float | None = Field(
        default=None, gt=0, description="NVLink bandwidth per GPU (bidirectional GB/s)."
    )
    pcie_gbytes_s: float = Field(gt=0, description="PCIe bandwidth per GPU (bidirectional GB/s).")
    sources: list[str] = Field(min_length=1)
    serving_fit: ServingFit | None = Field(
        default=None, description="Serving-model factors fitted to measurements of this GPU "
        "(scripts/fit_defaults.py); without it the model's literature defaults apply.")


class Catalog(_Row):
    instance_types: list[InstanceType]
    gpu_specs: dict[str, GpuSpec]

    def gpu_spec(self, row: InstanceType) -> GpuSpec:
        return self.gpu_specs[row.gpu]

    def get(self, cloud: Cloud, name: str) -> InstanceType | None:
        for row in self.instance_types:
            if row.cloud == cloud and row.name == name:
                return row
        return None

    def names(self, cloud: Cloud, nvlink_8gpu_only: bool = True) -> list[str]:
        return [
            r.name
            for r in self.instance_types
            if r.cloud == cloud and (not nvlink_8gpu_only or (r.nvlink and r.gpus == 8))
        ]


@cache
def load_catalog() -> Catalog:
    text = resources.files("poolctl.data").joinpath("instance_types.yaml").read_text()
    return Catalog.model_validate(yaml.safe_load(text))
