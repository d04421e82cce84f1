"""Sizing: memory, nodes, quota, cost and start-up estimates per pool and cloud.

Pure arithmetic over the parsed config and the catalog; no cloud calls, no cloud SDKs.
Every figure here is what `poolctl plan` prints, and what the rules judge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from poolctl.catalog import InstanceType, load_catalog
from poolctl.cloud import Cloud
from poolctl.config import DTYPE_BYTES, Pool, Target
from poolctl.errors import UsageError
from poolctl.node_image import NodeImage, file_node_image

GB = 1e9

# Start-up model. Each constant is an assumption with its reason; plan prints the phases so a
# user can see which one dominates and override by measuring (the boot script logs
# `phase=<name> seconds=<n>` for each).
BOOT_COLD_S = 120  # launch + OS + GPU driver/fabric manager init on an 8-GPU node
BOOT_FROM_STOPPED_S = 60  # start of a stopped warm node: no placement, no first-boot work
IMAGE_PULL_GBPS = 0.1  # GB/s registry pull + layer extraction (extraction is single-threaded)
# Weights come over one ENA/gVNIC interface (inference nodes carry no EFA/GPUDirect NICs),
# capped near 100 Gbit/s, and S3/GCS reach roughly a quarter of line rate per node in practice.
FETCH_NIC_CAP_GBIT = 100
FETCH_EFFICIENCY = 0.25
NVME_READ_GBPS_PER_DEVICE = 2.0  # sequential read of one local NVMe device, GB/s
LOAD_GBPS_PER_GPU = 2.0  # safetensors -> HBM per worker process, GB/s
ENGINE_INIT_S = 90  # vLLM KV-cache profiling + CUDA graph capture (vllm#44881: up to ~210 s)
# torch.compile, inside ENGINE_INIT_S on a node without a compile cache: Ray Serve LLM
# measured 60.8 s for Llama-3-70B (TP 4, 8x H100), vllm#19824 ~70 s (70B FP8, TP 8); and the
# same step from a shared cache: Baseten's torch.compile cache, "around 5-20 seconds"
# (docs/cloud-facts.md, Start-up time).
COMPILE_S = 60
COMPILE_HIT_S = 15
REGISTER_S = 30  # load balancer health checks: 2 x 15 s before traffic
NVME_HEADROOM = 1.2  # the cache holds the weights plus room for the next version's files
# A pre-pulled image skips the pull but its layers sit on a volume restored from a snapshot:
# the boot script reads them once (`phase=hydrate`) at the volume's first-read rate.
IMAGE_UNPACKED_RATIO = 2.0  # layers on disk vs. the compressed pull (~12 GB -> ~25 GB vLLM)
EBS_LAZY_READ_BPS = 135e6  # gp3 from a snapshot, no provisioned init rate: ~130-140 MB/s
GCE_BOOT_DISK_READ_BPS = 240 * 2**20  # pd-ssd per-disk read baseline (poolctl_stacks/gcp/pool.py)


@dataclass(frozen=True)
class QuotaNeed:
    """What a pool needs of one quota at its peak. A fallback type's need names the type
    (`fallback`) and the quota in words (`description`)."""

    name: str
    unit: str
    needed: int
    scope: str  # the region, or "global"
    fallback: str = ""
    description: str = ""

    def scaled(self, nodes: int, peak: int) -> QuotaNeed:
        """The need for `nodes` running at once instead of the `peak` it was sized for."""
        per_node = self.needed / peak if peak else 0
        return replace(self, needed=int(round(per_node * nodes)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "unit": self.unit, "needed": self.needed,
                               "scope": self.scope}
        if self.fallback:
            out.update(fallback=self.fallback, description=self.description)
        return out


@dataclass(frozen=True)
class NodeCounts:
    """A pool's sizes in one unit: nodes, or replicas (nodes `times` replicas per node)."""

    min: int
    max: int
    warm: int
    surge: int

    def times(self, k: int) -> NodeCounts:
        return NodeCounts(min=self.min * k, max=self.max * k, warm=self.warm * k,
                          surge=self.surge * k)

    def to_json(self) -> dict[str, int]:
        return {"min": self.min, "max": self.max, "warm": self.warm, "surge": self.surge}


@dataclass(frozen=True)
class HeldCapacity:
    """Capacity held (running nodes; stopped ones a reservation keeps room for) vs hoped for
    (stopped nodes without one): a stopped instance gives its capacity back, so its start is
    a new launch that can fail for capacity when the pool needs it most."""

    running_nodes: int  # the minimum and warm nodes kept running
    stopped_nodes: int  # warm nodes kept stopped
    reserved_nodes: int  # what the reservations hold (the placement's capacity.reserved_nodes)
    held_nodes: int
    hoped_nodes: int
    capacity_block: str | None = None  # the Capacity Block every node launches into (AWS)

    def words(self) -> str:
        """The one phrase plan, status and warm say it in."""
        h = self
        held = f"{h.held_nodes} node(s) held ({h.running_nodes} running"
        if h.held_nodes > h.running_nodes:
            held += f", {h.held_nodes - h.running_nodes} stopped in reserved room"
        held += f"; {h.reserved_nodes} reserved)" if h.reserved_nodes else ")"
        if h.hoped_nodes:
            held += (f"; {h.hoped_nodes} hoped for (stopped warm nodes without a reservation: "
                     "each start is a new launch that can fail for capacity)")
        if h.capacity_block:
            held += (f"; every node in Capacity Block {h.capacity_block}: held while the "
                     "block is active, none launches outside it (`poolctl capacity check` "
                     "shows its size and end)")
        return held


def held_capacity(running: int, stopped: int, reserved: int,
                  capacity_block: str | None = None) -> HeldCapacity:
    """Running nodes take reservation room first (a launch prefers a matching reservation);
    what is left of it keeps room for stopped nodes."""
    covered = min(stopped, max(0, reserved - running))
    return HeldCapacity(running_nodes=running, stopped_nodes=stopped, reserved_nodes=reserved,
                        held_nodes=running + covered, hoped_nodes=stopped - covered,
                        capacity_block=capacity_block)


@dataclass(frozen=True)
class CostSplit:
    """Cost per hour, fixed (reservations, paid whether used or not; nodes that always run)
    vs marginal (On-Demand nodes beyond those, billed while they run). A node running in a
    reservation is not billed again, so the bill is max(reserved, running) nodes."""

    price_per_node_hour: float
    fixed_nodes: int
    fixed_per_hour: float
    # Reserved nodes idle at the minimum: scaling out into them costs nothing more.
    reserved_idle_nodes: int
    marginal_per_node_hour: float
    marginal_at_max_per_hour: float


def billed_nodes(running: int, reserved: int) -> int:
    """The nodes billed while `running` nodes are up: reserved capacity is paid whether used
    or not, and a node running in it is not billed again. The one cost rule, which plan,
    deploy, status and simulate all price by."""
    return max(reserved, running)


def hourly_cost(running: int, reserved: int, price: float) -> float:
    """What the pool costs per hour (USD) with `running` nodes up at `price` per node-hour."""
    return round(billed_nodes(running, reserved) * price, 2)


def cost_split(running_min: int, running_max: int, reserved: int, price: float) -> CostSplit:
    fixed = billed_nodes(running_min, reserved)
    beyond = max(0, running_max - fixed)
    return CostSplit(price_per_node_hour=price, fixed_nodes=fixed,
                     fixed_per_hour=round(fixed * price, 2),
                     reserved_idle_nodes=max(0, reserved - running_min),
                     marginal_per_node_hour=round(price, 2),
                     marginal_at_max_per_hour=round(beyond * price, 2))


def reserved_nodes(pool: Pool, cloud: Cloud) -> int:
    placement = pool.placement(cloud)
    return placement.capacity.reserved_nodes if placement is not None else 0


def capacity_block(pool: Pool, cloud: Cloud) -> str | None:
    """The Capacity Block the pool's every node launches into (aws.capacity.capacity_block)."""
    return pool.aws.capacity.capacity_block if cloud == Cloud.aws and pool.aws else None


@dataclass(frozen=True)
class PoolPlan:
    pool: str
    cloud: Cloud
    region: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    tensor_parallel: int
    replicas_per_node: int
    weights_bytes: int
    weights_bytes_per_gpu: int
    hbm_bytes_per_gpu: int
    usable_hbm_bytes_per_gpu: int
    kv_cache_bytes_per_token: int
    kv_cache_bytes_per_token_per_gpu: int
    kv_cache_bytes_per_gpu: int
    kv_cache_tokens_per_replica: int
    max_concurrent_sequences_per_replica: int
    decode_step_floor_ms: float
    replicas: NodeCounts
    nodes: NodeCounts
    warm_state: str
    quota: QuotaNeed  # the type's own (`quotas[0]`)
    quotas: list[QuotaNeed]
    price_per_node_hour_usd: float
    cost_per_hour_usd: dict[str, float]
    start_seconds: dict[str, float]
    start_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    node_image: NodeImage | None = None
    # Draw at min and max nodes (warm nodes kept running included, as in the cost), from the
    # catalog's maximum system power per node; None when the catalog has no figure.
    power_kw: dict[str, float] | None = None
    power_source: str | None = None
    capacity: HeldCapacity | None = None
    cost_split_usd: CostSplit | None = None
    # The quotas fallback types draw on beyond `quotas` (each need names its `fallback`):
    # the pool's peak on that type alone.
    fallback_quotas: list[QuotaNeed] = field(default_factory=list)

    @property
    def warm_running_nodes(self) -> int:
        """Warm nodes kept running hold capacity (and cost); stopped ones give it back."""
        return self.nodes.warm if self.warm_state == "running" else 0

    def to_json(self) -> dict[str, Any]:
        # asdict turns NodeCounts into its fields in order, the dict `--json` always had;
        # the quota needs are written as they always were (`quota` names its scope region).
        d = asdict(self)
        q = self.quota
        d["quota"] = {"name": q.name, "unit": q.unit, "needed": q.needed, "region": q.scope}
        d["quotas"] = [n.to_json() for n in self.quotas]
        d["fallback_quotas"] = [n.to_json() for n in self.fallback_quotas]
        return d


def kv_bytes(pool: Pool) -> float:
    """Bytes per KV element: `auto` keeps 8/4-bit models' KV in bfloat16, as vLLM does."""
    kv = pool.serving.kv_cache_dtype
    if kv == "auto":
        dtype = pool.model.dtype
        assert dtype is not None  # validation fills it (config.Model) or refuses the file
        return 2 if DTYPE_BYTES[dtype] < 2 else DTYPE_BYTES[dtype]
    return DTYPE_BYTES[kv]


def kv_bytes_per_token(pool: Pool) -> int:
    """Whole model, all layers, K and V."""
    m = pool.model
    # validation fills these (config.Model) or refuses the file
    assert m.layers is not None and m.kv_heads is not None and m.head_dim is not None
    return int(2 * m.layers * m.kv_heads * m.head_dim * kv_bytes(pool))


def kv_bytes_per_token_per_gpu(pool: Pool) -> int:
    # Tensor parallel splits KV heads across GPUs; with fewer KV heads than GPUs each GPU
    # holds a replicated head, so the per-GPU share never drops below one head.
    m, tp = pool.model, pool.serving.tensor_parallel
    # validation fills these (config.Model) or refuses the file
    assert m.layers is not None and m.kv_heads is not None and m.head_dim is not None
    heads_per_gpu = max(1, math.ceil(m.kv_heads / tp))
    return int(2 * m.layers * heads_per_gpu * m.head_dim * kv_bytes(pool))


def weights_bytes(pool: Pool) -> int:
    m = pool.model
    # validation fills these (config.Model) or refuses the file
    assert m.params_b is not None and m.dtype is not None
    return int(round(m.params_b * GB * DTYPE_BYTES[m.dtype]))


def replicas_per_node(pool: Pool, row: InstanceType) -> int:
    return max(1, row.gpus // pool.serving.tensor_parallel)


def nodes_for(replicas: int, per_node: int) -> int:
    return math.ceil(replicas / per_node)


def instance_row(pool: Pool, cloud: Cloud) -> InstanceType:
    placement = pool.placement(cloud)
    if placement is None:
        raise UsageError(f"--cloud {cloud}: pool {pool.name!r} has no `{cloud}:` placement")
    name = placement.type_name
    row = load_catalog().get(cloud, name)
    if row is None:
        raise UsageError(f"pools.{pool.name}.{cloud}.{placement.TYPE_KEY}: {name!r} is not in "
                         "the catalog")
    return row


def gcp_zones(pool: Pool, row: InstanceType) -> list[str]:
    """The regional MIG's zones: the file's, else the catalog's for the region."""
    assert pool.gcp is not None  # asked only of a pool with a gcp placement
    return list(pool.gcp.zones) or list(row.regions.get(pool.gcp.region, []))


def fetch_bytes_per_s(row: InstanceType) -> float:
    return min(row.network_gbps, FETCH_NIC_CAP_GBIT) * GB / 8 * FETCH_EFFICIENCY


def hydrate_seconds(pool: Pool, cloud: Cloud) -> float:
    """First read of a pre-pulled image's layers; on AWS at the provisioned volume
    initialization rate when the placement sets one."""
    layers = pool.serving.image_size_gb * IMAGE_UNPACKED_RATIO * GB
    if cloud == Cloud.aws:
        assert pool.aws is not None  # asked only for a cloud the pool has a placement on
        rate = pool.aws.volume_initialization_rate_mib_s
        return layers / (rate * 2**20 if rate else EBS_LAZY_READ_BPS)
    return layers / GCE_BOOT_DISK_READ_BPS


def compile_miss_s(pool: Pool, cloud: Cloud) -> float:
    """What a start without a compile cache takes beyond the plan's `engine_init`: 0 for a
    pool that shares none (every node compiles: ENGINE_INIT_S counts it), COMPILE_S -
    COMPILE_HIT_S for one that does (the plan counts the fetch; the pool's first node, and
    any that finds no cache, compiles)."""
    placement = pool.placement(cloud)
    if placement is None or placement.compile_cache_uri is None:
        return 0.0
    return float(COMPILE_S - COMPILE_HIT_S)


def weights_path(pool: Pool, row: InstanceType) -> str:
    """`fetch` or `stream`: the placement's `weights_load`, `auto` resolved to the faster by
    weights_seconds (a tie fetches: it checks the weights first)."""
    placement = pool.placement(Cloud(row.cloud))
    how = placement.weights_load if placement is not None else "fetch"
    if how != "auto":
        return how
    fetch, stream = (sum(weights_seconds(pool, row, h)) for h in ("fetch", "stream"))
    return "stream" if stream < fetch else "fetch"


def weights_seconds(pool: Pool, row: InstanceType, load: str | None = None
                    ) -> tuple[float, float]:
    """(to NVMe, into GPU memory) in seconds, by weights_path (or `load`).

    fetch: the node copies the weights once at the object store's per-node rate, then every
    replica reads them from NVMe (the devices' read rate shared) at LOAD_GBPS_PER_GPU per GPU.
    stream: nothing waits for NVMe; each replica streams its own copy (its TP ranks share the
    reading: the streamer's `distributed` mode), all of them through the node's one
    object-store rate, the copy to HBM overlapping the download."""
    how = load or weights_path(pool, row)
    w = weights_bytes(pool)
    per_gpu = w / pool.serving.tensor_parallel
    to_gpu = per_gpu / (LOAD_GBPS_PER_GPU * GB)
    if how == "stream":
        return 0.0, max(replicas_per_node(pool, row) * w / fetch_bytes_per_s(row), to_gpu)
    nvme_rate = max(1, row.local_nvme.count) * NVME_READ_GBPS_PER_DEVICE * GB
    return w / fetch_bytes_per_s(row), max(w / nvme_rate, to_gpu)


def start_phases(pool: Pool, row: InstanceType, image: NodeImage | None = None
                 ) -> dict[str, dict[str, float]]:
    """`image`: the node image as the caller knows it (`plan` reads the build records:
    `node_image.recorded_node_image`); None: the file's view, what the stacks use."""
    if image is None:
        image = file_node_image(pool, Cloud(row.cloud))
    # Cold from a pre-pulled image: no pull, one read of the layers instead.
    pull = ({"hydrate": hydrate_seconds(pool, Cloud(row.cloud))}
            if image.prepulled
            else {"image": pool.serving.image_size_gb / IMAGE_PULL_GBPS})
    fetch, load = weights_seconds(pool, row)
    # A pool sharing its compile cache: every node but the first fetches it (compile_miss_s)
    engine_init = ENGINE_INIT_S - compile_miss_s(pool, Cloud(row.cloud))
    cold = {
        "boot": BOOT_COLD_S,
        **pull,
        "weights_to_nvme": fetch,
        "load_to_gpu": load,
        "engine_init": engine_init,
        "register": REGISTER_S,
    }
    # A stopped warm node keeps its EBS/boot disk (image pulled or read already) but its NVMe
    # comes back empty: the weights are fetched again on every start.
    warm_stopped = {
        "boot": BOOT_FROM_STOPPED_S,
        "image": 0.0,
        "weights_to_nvme": fetch,
        "load_to_gpu": load,
        "engine_init": engine_init,
        "register": REGISTER_S,
    }
    warm_running = {"register": REGISTER_S}
    def r(d: Mapping[str, float]) -> dict[str, float]:
        return {k: round(v, 1) for k, v in d.items()}

    return {"cold": r(cold), "warm_stopped": r(warm_stopped), "warm_running": r(warm_running)}


def plan_pool(pool: Pool, cloud: Cloud, image: NodeImage | None = None) -> PoolPlan:
    """The pool's figures on `cloud`; `image` as in `start_phases`."""
    row = instance_row(pool, cloud)
    placement = pool.placement(cloud)
    assert placement is not None  # instance_row refuses a pool without one
    tp = pool.serving.tensor_parallel
    rpn = replicas_per_node(pool, row)
    w = weights_bytes(pool)
    w_gpu = w // tp
    hbm = row.hbm_bytes_per_gpu
    usable = int(hbm * pool.serving.gpu_memory_utilization)
    reserved = int(pool.serving.reserved_gib_per_gpu * 2**30)
    kv_gpu = max(0, usable - w_gpu - reserved)
    per_tok_gpu = kv_bytes_per_token_per_gpu(pool)
    kv_tokens = kv_gpu // per_tok_gpu
    seqs = kv_tokens // pool.serving.max_model_len

    s, wp = pool.scaling, pool.warm_pool
    surge = nodes_for(pool.rollout.max_surge_replicas, rpn)
    if cloud == Cloud.gcp and surge:
        # A regional MIG takes a fixed surge of 0 or at least one VM per zone.
        surge = max(surge, len(gcp_zones(pool, row)))
    nodes = NodeCounts(
        min=nodes_for(s.min_replicas, rpn),
        max=nodes_for(s.max_replicas, rpn),
        warm=nodes_for(wp.replicas, rpn),
        surge=surge,
    )
    warm_running = nodes.warm if wp.state == "running" else 0
    reserved = reserved_nodes(pool, cloud)
    # Running-instance quotas count what can run at once: the pool at max, warm nodes kept
    # running, and the rollout's surge. Stopped warm nodes do not count.
    peak_nodes = nodes.max + nodes.surge + warm_running
    quotas = [
        QuotaNeed(row.quota.name, row.quota.unit, peak_nodes * row.quota_per_node, placement.region)
    ]
    if cloud == Cloud.gcp:
        quotas += [
            QuotaNeed("CPUS", "vCPU", peak_nodes * row.vcpus, placement.region),
            QuotaNeed(
                "LOCAL_SSD_TOTAL_GB",
                "GB",
                int(peak_nodes * row.local_nvme.count * row.local_nvme.size_gb),
                placement.region,
            ),
            QuotaNeed("GPUS_ALL_REGIONS", "GPU", peak_nodes * row.gpus, "global"),
        ]
    # A fallback type may draw on a GPU quota of its own (GCP: one per GPU model, e.g.
    # a3-megagpu-8g on NVIDIA_H100_MEGA_GPUS); the pool's peak could land on it.
    fallback_quotas: list[QuotaNeed] = []
    seen = {row.quota.name}
    for name in placement.fallback_types:
        fb = load_catalog().get(Cloud(cloud), name)
        if fb is None or fb.quota.name in seen:
            continue  # not in the catalog: rule fallback-types says so
        seen.add(fb.quota.name)
        fallback_quotas.append(QuotaNeed(
            fb.quota.name, fb.quota.unit, peak_nodes * fb.quota_per_node, placement.region,
            fallback=name, description=fb.quota.description or fb.quota.name))
    price = placement.price_per_hour_usd or row.price.usd_per_hour
    if image is None:
        image = file_node_image(pool, Cloud(cloud))
    phases = start_phases(pool, row, image)
    totals = {k: round(sum(v.values()), 1) for k, v in phases.items()}
    warm_key = "warm_running" if wp.state == "running" else "warm_stopped"
    return PoolPlan(
        pool=pool.name,
        cloud=cloud,
        region=placement.region,
        instance_type=row.name,
        gpu=row.gpu,
        gpus_per_node=row.gpus,
        tensor_parallel=tp,
        replicas_per_node=rpn,
        weights_bytes=w,
        weights_bytes_per_gpu=w_gpu,
        hbm_bytes_per_gpu=hbm,
        usable_hbm_bytes_per_gpu=usable,
        kv_cache_bytes_per_token=kv_bytes_per_token(pool),
        kv_cache_bytes_per_token_per_gpu=per_tok_gpu,
        kv_cache_bytes_per_gpu=kv_gpu,
        kv_cache_tokens_per_replica=kv_tokens,
        max_concurrent_sequences_per_replica=seqs,
        # Each decode step streams the GPU's weight shard from HBM at least once.
        decode_step_floor_ms=round(w_gpu / (row.hbm_tbps_per_gpu * 1e12) * 1000, 2),
        replicas=nodes.times(rpn),
        nodes=nodes,
        warm_state=wp.state,
        quota=quotas[0],
        quotas=quotas,
        fallback_quotas=fallback_quotas,
        price_per_node_hour_usd=price,
        cost_per_hour_usd={
            "min": hourly_cost(nodes.min + warm_running, reserved, price),
            "max": hourly_cost(nodes.max + warm_running, reserved, price),
        },
        start_seconds={"cold": totals["cold"], "warm": totals[warm_key]},
        start_phases=phases,
        node_image=image,
        power_kw=None if row.power is None else {
            "min": round((nodes.min + warm_running) * row.power.max_kw, 1),
            "max": round((nodes.max + warm_running) * row.power.max_kw, 1),
        },
        power_source=None if row.power is None else row.power.source,
        capacity=held_capacity(nodes.min + warm_running, nodes.warm - warm_running,
                               reserved, capacity_block(pool, cloud)),
        cost_split_usd=cost_split(nodes.min + warm_running, nodes.max + warm_running,
                                  reserved, price),
    )


def quota_key(pool: Pool, cloud: Cloud, need: QuotaNeed) -> tuple[str, str, str, str]:
    """What makes two needs draw on one quota: cloud, project (GCP quotas are per project;
    AWS pools of one file are taken to be one account's), scope and quota name."""
    if cloud == Cloud.gcp:
        assert pool.gcp is not None  # asked only for a cloud the pool has a placement on
        project = pool.gcp.project
    else:
        project = ""
    return cloud, project, need.scope, need.name


def quota_totals(targets: list[Target]) -> list[dict[str, Any]]:
    """The peak needs of `targets` summed per quota they share, in the order first needed."""
    totals: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for target in targets:
        pool, cloud = target.pool, target.cloud
        for q in plan_pool(pool, cloud).quotas:
            cloud_, project, scope, name = quota_key(pool, cloud, q)
            t = totals.setdefault((cloud_, project, scope, name), {
                "cloud": cloud, "project": project or None, "region": scope, "name": name,
                "unit": q.unit, "needed": 0, "pools": [], "needed_by_pool": {}})
            t["needed"] += q.needed
            t["pools"].append(pool.name)
            t["needed_by_pool"][pool.name] = q.needed
    return list(totals.values())
