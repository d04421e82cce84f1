"""The CLI's side of a sandbox that serves (`sandbox start --serve`): the weights a pool's
nodes fetch, and the loopback endpoint of a pool's load balancer."""

from __future__ import annotations

import json
import tempfile
import threading
import urllib.error
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from poolctl import naming
from poolctl.adaptors.aws import boto3
from poolctl.config import Config, Pool
from poolctl.endpoints import AwsEndpoint, LocalAddress
from poolctl.errors import OperationFailed, UsageError
from poolctl.formats import parse_object_prefix
from poolctl.sandbox.admin_api import admin
from poolctl.weights import write_manifest

# The stand-in weights: a config.json with the pool's shapes and one small tensor file. The
# engine stand-in serves from the pool's own figures; these only make the fetch, the
# manifest check and the marker real.
TENSOR_BYTES = 1 << 16


def serving_report(endpoint_url: str) -> dict[str, Any]:
    """GET /_poolctl/serving: the nodes and load balancers of a serving sandbox."""
    try:
        return admin(endpoint_url, "GET", "/_poolctl/serving", None, "report what it serves")
    except urllib.error.HTTPError as exc:
        raise OperationFailed(f"the sandbox at {endpoint_url} is older than this poolctl "
                              f"({exc}); restart it with `poolctl sandbox stop && poolctl "
                              "sandbox start --serve`") from None


def sandbox_clock(endpoint_url: str) -> datetime:
    """The sandbox's clock (GET /_poolctl/clock): the machine's time plus the offset a test
    set, running S times faster in a sandbox that serves at speed S."""
    got = admin(endpoint_url, "GET", "/_poolctl/clock", None, "tell its time")
    try:
        moment = datetime.fromisoformat(str(got["now"]))
    except (KeyError, ValueError):
        raise OperationFailed(f"the sandbox at {endpoint_url} answered its time as "
                              f"{str(got)[:80]!r}; restart it") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _config_json(pool: Pool) -> dict[str, Any]:
    m = pool.model
    out: dict[str, Any] = {"architectures": ["LlamaForCausalLM"],
                           "num_hidden_layers": m.layers, "num_key_value_heads": m.kv_heads,
                           "head_dim": m.head_dim, "hidden_size": m.hidden_size,
                           "torch_dtype": "bfloat16" if m.dtype in (None, "bfloat16") else m.dtype,
                           "max_position_embeddings": pool.serving.max_model_len}
    if m.experts:
        out.update(num_experts=m.experts, num_experts_per_tok=m.experts_per_token)
    return {k: v for k, v in out.items() if v is not None}


def seed_weights(aws: AwsEndpoint, pool: Pool) -> bool:
    """Put stand-in weights at the pool's weights_uri in the sandbox's S3, unless something
    is there already (the user's own upload wins). True when it wrote them."""
    assert pool.aws is not None
    where = parse_object_prefix(pool.aws.weights_uri, "s3")
    bucket, prefix = where.bucket, where.prefix
    s3 = boto3.client("s3", **aws.client_kwargs(pool.aws.region))
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception:  # botocore's ClientError: the bucket is not there yet
        kw = ({} if pool.aws.region == "us-east-1" else
              {"CreateBucketConfiguration": {"LocationConstraint": pool.aws.region}})
        s3.create_bucket(Bucket=bucket, **kw)
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount"):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(_config_json(pool), indent=1))
        (folder / "model-00001-of-00001.safetensors").write_bytes(
            bytes(range(256)) * (TENSOR_BYTES // 256))
        write_manifest(folder)
        for f in sorted(folder.iterdir()):
            s3.upload_file(str(f), bucket, f"{prefix}{f.name}")
    return True


def lb_address(endpoint_url: str, dns: str) -> LocalAddress | None:
    """Where HAProxy serves the load balancer `dns` (https when its listener has a
    certificate); None when the sandbox does not serve (or not that one)."""
    try:
        report = serving_report(endpoint_url)
    except OperationFailed:
        return None
    for lb in report.get("load_balancers", []):
        if lb.get("DNSName") == dns and lb.get("Endpoint"):
            scheme, _, rest = str(lb["Endpoint"]).partition("://")
            host, _, port = rest.partition(":")
            return LocalAddress(scheme, host, int(port), lb.get("CaFile"))
    return None


@dataclass(frozen=True)
class PoolEndpoint:
    """Where a sandbox serves one pool."""

    url: str  # http://127.0.0.1:PORT of the pool's load balancer
    speed: float  # the sandbox's
    dns: str  # the load balancer's DNS name, as the sandbox's ELB API reports it
    admin_url: str  # the sandbox itself
    ca_file: str | None = None  # with HTTPS: the certificate to trust (the sandbox's ACM's)


def sandbox_endpoint(aws: AwsEndpoint, cfg: Config, pool: Pool) -> PoolEndpoint:
    """Where the sandbox serves the pool, or a UsageError saying what is missing."""
    report = serving_report(aws.url)
    if not report.get("serving"):
        raise UsageError("--sandbox: this sandbox does not serve; restart it with `poolctl "
                         "sandbox stop && poolctl sandbox start --serve`")
    assert pool.aws is not None
    elbv2 = boto3.client("elbv2", **aws.client_kwargs(pool.aws.region))
    want = naming.aws_tags(cfg, pool)
    lbs = elbv2.describe_load_balancers().get("LoadBalancers", [])
    dns = None
    if lbs:
        tags = elbv2.describe_tags(ResourceArns=[lb["LoadBalancerArn"] for lb in lbs])
        for desc, lb in zip(tags["TagDescriptions"], lbs, strict=True):
            have = {t["Key"]: t["Value"] for t in desc.get("Tags", [])}
            if all(have.get(k) == v for k, v in want.items()):
                dns = lb["DNSName"]
    if dns is None:
        raise UsageError(f"--sandbox: pool {pool.name} has no load balancer in the sandbox; "
                         "deploy it first (poolctl deploy --sandbox)")
    for lb in report.get("load_balancers", []):
        if lb.get("DNSName") == dns and lb.get("Endpoint"):
            return PoolEndpoint(str(lb["Endpoint"]), float(report.get("speed") or 1.0), dns,
                                aws.url, lb.get("CaFile"))
    raise UsageError(f"--sandbox: pool {pool.name}'s load balancer has no listener serving "
                     "yet; wait a second and retry")


@dataclass(frozen=True)
class InService:
    """From `pool_s` (pool seconds since the timeline began) on, `nodes` targets were
    registered to the pool's load balancer."""

    pool_s: float
    nodes: int


class NodesTimeline:
    """Nodes in service behind a pool's load balancer over time, sampled from the sandbox's
    serving report every `every_s` wall seconds on a thread while a `with` block runs; only
    changes are kept. Times are the sandbox's pool seconds."""

    def __init__(self, ep: PoolEndpoint, every_s: float = 0.5) -> None:
        self.ep, self.every_s = ep, every_s
        self.points: list[InService] = []
        self._t0: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replay-nodes", daemon=True)

    def _sample(self) -> None:
        try:
            rep = serving_report(self.ep.admin_url)
        except OperationFailed:
            return  # a missed sample; the next one says the same
        lbs = [lb for lb in rep.get("load_balancers", []) if lb.get("DNSName") == self.ep.dns]
        now = rep.get("pool_seconds")
        if not lbs or not isinstance(now, int | float):
            return
        n = sum(len(t) for t in (lbs[0].get("Targets") or {}).values())
        if self._t0 is None:
            self._t0 = float(now)
        if not self.points or self.points[-1].nodes != n:
            self.points.append(InService(round(float(now) - self._t0, 1), n))

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self._sample()

    def __enter__(self) -> NodesTimeline:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._sample()
