"""The instance-type catalog (cli/poolctl/data/instance_types.yaml) loads, is complete, and agrees
with EC2's own data.

The AWS rows are checked against the DescribeInstanceTypes data that moto ships (read straight
from moto's package files, no server), so a typo in a GPU count, a memory size or a disk layout
fails here instead of mis-sizing a pool.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path

import pytest

from poolctl.catalog import Catalog, InstanceType, load_catalog

AWS_NVLINK = {
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
}
AWS_PCIE = {"g5.48xlarge", "g6.48xlarge", "g6e.48xlarge"}
GCP_NVLINK = {
    "a2-highgpu-8g",
    "a2-ultragpu-8g",
    "a3-highgpu-8g",
    "a3-edgegpu-8g",
    "a3-megagpu-8g",
    "a3-ultragpu-8g",
    "a4-highgpu-8g",
}
GCP_PCIE = {"g2-standard-96"}

CATALOG = load_catalog()
AWS_ROWS = [r for r in CATALOG.instance_types if r.cloud == "aws"]
GCP_ROWS = [r for r in CATALOG.instance_types if r.cloud == "gcp"]


def _ids(rows: list[InstanceType]) -> list[str]:
    return [r.name for r in rows]


# ------------------------------------------------------------------ shape and completeness


def test_catalog_has_exactly_the_expected_rows():
    names = [(r.cloud, r.name) for r in CATALOG.instance_types]
    assert len(names) == len(set(names)), "duplicate rows"
    assert {n for c, n in names if c == "aws"} == AWS_NVLINK | AWS_PCIE
    assert {n for c, n in names if c == "gcp"} == GCP_NVLINK | GCP_PCIE


def test_nvlink_flag_matches_the_known_split():
    assert set(CATALOG.names("aws")) == AWS_NVLINK
    assert set(CATALOG.names("gcp")) == GCP_NVLINK
    assert set(CATALOG.names("aws", nvlink_8gpu_only=False)) == AWS_NVLINK | AWS_PCIE


@pytest.mark.parametrize("row", CATALOG.instance_types, ids=_ids(CATALOG.instance_types))
def test_every_row_names_sources_and_a_dated_price(row: InstanceType):
    assert row.sources and all(s.strip() for s in row.sources)
    assert row.price.usd_per_hour > 0
    assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", row.price.date), row.price.date
    assert row.price.source.strip()
    # The price must be for a region where the row says the type is offered.
    assert row.price.region in row.regions


@pytest.mark.parametrize("row", CATALOG.instance_types, ids=_ids(CATALOG.instance_types))
def test_nvlink_rows_have_8_gpus(row: InstanceType):
    if row.nvlink:
        assert row.gpus == 8


@pytest.mark.parametrize("row", CATALOG.instance_types, ids=_ids(CATALOG.instance_types))
def test_quota_matches_the_family(row: InstanceType):
    if row.cloud == "aws":
        assert row.quota.unit == "vCPU"
        # P types count against the P quota, G types against the G-and-VT quota.
        expected = {"p": "L-417A185B", "g": "L-DB2E81BA"}[row.name[0]]
        assert row.quota.name == expected
    else:
        assert row.quota.unit == "GPU"
        assert re.fullmatch(r"NVIDIA_[A-Z0-9_]+_GPUS", row.quota.name), row.quota.name


@pytest.mark.parametrize("row", GCP_ROWS, ids=_ids(GCP_ROWS))
def test_gcp_zones_belong_to_their_region(row: InstanceType):
    # Price region first: the brief prices GCP rows in us-central1, where every type is offered.
    assert row.price.region == "us-central1"
    for region, zones in row.regions.items():
        assert zones, f"{row.name}: {region} lists no zones"
        for zone in zones:
            assert re.fullmatch(rf"{re.escape(region)}-[a-z]", zone), zone


# ------------------------------------------------------------------ hand-checked facts


def test_p5_hand_checked():
    row = CATALOG.get("aws", "p5.48xlarge")
    assert row is not None
    assert (row.gpu, row.gpus, row.hbm_mib_per_gpu, row.vcpus) == ("H100", 8, 81_920, 192)
    assert (row.local_nvme.count, row.local_nvme.size_gb, row.local_nvme.bundled) == (8, 3800, True)
    assert row.local_nvme.total_bytes == 30.4e12
    assert row.rdma.kind == "efa" and row.rdma.max_interfaces == 32
    assert row.quota.name == "L-417A185B"
    # 81,920 MiB = 80 GiB = 85,899,345,920 bytes.
    assert row.hbm_bytes_per_gpu == 85_899_345_920
    # One node takes 192 vCPUs of the P quota.
    assert row.quota_per_node == 192


def test_a3_highgpu_hand_checked():
    row = CATALOG.get("gcp", "a3-highgpu-8g")
    assert row is not None
    assert (row.gpus, row.hbm_mib_per_gpu, row.vcpus) == (8, 81_920, 208)
    assert (row.local_nvme.count, row.local_nvme.size_gb, row.local_nvme.bundled) == (16, 375, True)
    assert row.local_nvme.total_bytes == 6.0e12
    assert row.quota.name == "NVIDIA_H100_GPUS" and row.quota.unit == "GPU"
    assert row.quota_per_node == 8
    assert row.rdma.kind == "gpudirect-tcpx"
    assert row.regions["us-central1"] == ["us-central1-a", "us-central1-b", "us-central1-c"]


def test_catalog_rejects_an_unknown_key():
    # extra=forbid is what turns a misspelt key in the YAML into a load error.
    raw = CATALOG.model_dump()
    raw["instance_types"][0]["gpu_count"] = 8
    with pytest.raises(ValueError, match="gpu_count"):
        Catalog.model_validate(raw)


# ------------------------------------------------------------------ agreement with EC2 data


@cache
def _moto_resources() -> Path:
    moto = pytest.importorskip("moto", reason="moto is not installed: no EC2 reference data")
    return Path(moto.__file__).parent / "ec2" / "resources"


def _load_json(path_without_gz: Path):
    # moto 5 ships its resources gzipped; older releases shipped plain JSON.
    gz = path_without_gz.with_name(path_without_gz.name + ".gz")
    if gz.exists():
        with gzip.open(gz, "rt") as f:
            return json.load(f)
    if path_without_gz.exists():
        return json.loads(path_without_gz.read_text())
    pytest.skip(f"moto has no {path_without_gz.name}: this moto release lacks the EC2 data")


@cache
def _moto_instance_types() -> dict:
    return _load_json(_moto_resources() / "instance_types.json")


@cache
def _moto_regions_offering(instance_type: str) -> frozenset[str]:
    folder = _moto_resources() / "instance_type_offerings" / "region"
    regions = set()
    for path in folder.glob("*.json*"):
        region = path.name.split(".")[0]
        offers = _load_json(folder / f"{region}.json")
        if any(o["InstanceType"] == instance_type for o in offers):
            regions.add(region)
    return frozenset(regions)


def moto_mismatches(row: InstanceType, ec2: dict) -> list[str]:
    """What in `row` disagrees with one DescribeInstanceTypes entry (empty when all agree)."""
    gpus = ec2["GpuInfo"]["Gpus"]
    disks = ec2.get("InstanceStorageInfo", {}).get("Disks", [])
    net = ec2["NetworkInfo"]
    found = {
        "gpu": gpus[0]["Name"],
        "gpus": sum(g["Count"] for g in gpus),
        "hbm_mib_per_gpu": gpus[0]["MemoryInfo"]["SizeInMiB"],
        "vcpus": ec2["VCpuInfo"]["DefaultVCpus"],
        "ram_mib": ec2["MemoryInfo"]["SizeInMiB"],
        "nvme": [(d["Count"], d["SizeInGB"]) for d in disks],
        "efa": net.get("EfaSupported", False),
        "efa_max": net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0),
    }
    ours = {
        "gpu": row.gpu,
        "gpus": row.gpus,
        "hbm_mib_per_gpu": row.hbm_mib_per_gpu,
        "vcpus": row.vcpus,
        "ram_mib": row.ram_gib * 1024,
        "nvme": [(row.local_nvme.count, row.local_nvme.size_gb)] if row.local_nvme.count else [],
        "efa": row.rdma.kind == "efa",
        "efa_max": row.rdma.max_interfaces,
    }
    return [f"{k}: catalog {ours[k]!r}, EC2 {found[k]!r}" for k in found if ours[k] != found[k]]


@pytest.mark.parametrize("row", AWS_ROWS, ids=_ids(AWS_ROWS))
def test_aws_row_agrees_with_describe_instance_types(row: InstanceType):
    ec2 = _moto_instance_types().get(row.name)
    assert ec2 is not None, f"moto's EC2 data has no {row.name}"
    assert moto_mismatches(row, ec2) == []


@pytest.mark.parametrize("row", [r for r in AWS_ROWS if r.nvlink], ids=_ids(
    [r for r in AWS_ROWS if r.nvlink]))
def test_vpc_bandwidth_is_the_primary_network_cards(row: InstanceType):
    """A node without EFA sends IP traffic through network card 0 only: the catalog's
    `vpc.instance_gbps` is that card's baseline, not the type's all-cards figure."""
    cards = _moto_instance_types()[row.name]["NetworkInfo"]["NetworkCards"]
    card0 = next(c for c in cards if c["NetworkCardIndex"] == 0)
    assert row.vpc is not None
    assert row.vpc.instance_gbps == card0["BaselineBandwidthInGbps"] < row.network_gbps
    assert row.vpc.flow_gbps == 5  # EC2 user guide: one flow outside a placement group


@pytest.mark.parametrize("row", AWS_ROWS, ids=_ids(AWS_ROWS))
def test_aws_regions_offer_the_type(row: InstanceType):
    offered = _moto_regions_offering(row.name)
    assert set(row.regions) <= offered, sorted(set(row.regions) - offered)
    assert all(zones == [] for zones in row.regions.values())


def test_comparison_catches_a_typo():
    # Guards the guard: a one-digit slip in any compared field must be reported.
    row = CATALOG.get("aws", "p5.48xlarge")
    ec2 = _moto_instance_types()["p5.48xlarge"]
    assert moto_mismatches(row, ec2) == []
    typos = {
        "vcpus": 191,
        "hbm_mib_per_gpu": 81_900,
        "ram_gib": 2047,
        "local_nvme": row.local_nvme.model_copy(update={"size_gb": 3840}),
        "rdma": row.rdma.model_copy(update={"max_interfaces": 16}),
    }
    for field, value in typos.items():
        broken = row.model_copy(update={field: value})
        assert moto_mismatches(broken, ec2), f"a wrong {field} went unnoticed"
