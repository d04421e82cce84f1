"""GCP runtime operations (`poolctl.clouds.gcp.ops.GcpOps`) against a local fake of the Compute
Engine REST API (tests/fakes/gce.py), with the real google-cloud-compute and
google-cloud-quotas clients over HTTP.

The pool is the contract's example (tests/configs.pool_yaml) on a3-highgpu-8g in
us-central1, worked out by hand:
- tensor_parallel 2 on 8 GPUs: 4 replicas per node;
- min 4 replicas -> 1 node, max 24 -> 6 nodes, warm 8 (stopped) -> 2 standby nodes;
- max_surge_replicas 4 -> 1 node, raised to 3: a regional MIG over 3 zones surges by at
  least one VM per zone;
- peak running at once: 6 max + 3 surge = 9 nodes -> 9 x 8 = 72 NVIDIA_H100_GPUS,
  9 x 208 = 1,872 CPUS, 9 x 16 x 375 = 54,000 LOCAL_SSD_TOTAL_GB, 72 GPUS_ALL_REGIONS.
The fake is seeded as `poolctl deploy` leaves the pool: 1 serving VM, 2 stopped standby VMs,
autoscaler 1..6, surge 3.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1",
                    reason="google-cloud-compute is not installed (pip install -e .[gcp])")
pytest.importorskip("google.cloud.cloudquotas_v1",
                    reason="google-cloud-quotas is not installed (pip install -e .[gcp])")

from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import compute_v1  # noqa: E402

from poolctl import naming  # noqa: E402
from poolctl.cloud import Cloud  # noqa: E402
from poolctl.clouds.base import (  # noqa: E402
    ForgottenTemplate,
    Group,
    TemplatesDeleted,
    VersionRow,
)
from poolctl.clouds.gcp import rollout as gcp  # noqa: E402
from poolctl.clouds.gcp.mig import node_phase  # noqa: E402
from poolctl.clouds.gcp.ops import GcpOps, make_ops  # noqa: E402
from poolctl.clouds.gcp.quota import cloud_quota  # noqa: E402
from poolctl.clouds.gcp.rollout import replaced_templates  # noqa: E402
from poolctl.config import Target, parse_config  # noqa: E402
from poolctl.endpoints import CloudEndpoints  # noqa: E402
from poolctl.errors import OperationFailed, UsageError  # noqa: E402
from poolctl.sizing import plan_pool  # noqa: E402
from tests import inproc  # noqa: E402
from tests.configs import pool_yaml  # noqa: E402
from tests.fakes.gce import FakeGce  # noqa: E402
from tests.fakes.stack import PlanShown, StoodInStack, stand_in, start_rollout  # noqa: E402

PROJECT, REGION, MIG = "acme-prod", "us-central1", "acme-chat-70b"
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
V1 = "acme-chat-70b-20260105090000000000000001"
V2 = "acme-chat-70b-20260201090000000000000002"
V0 = "acme-chat-70b-20251201090000000000000000"  # two rollouts back
MIG_LINK = ("https://www.googleapis.com/compute/v1/projects/acme-prod/regions/us-central1/"
            "instanceGroupManagers/acme-chat-70b")


@pytest.fixture
def cfg():
    return parse_config(pool_yaml())


@pytest.fixture
def pool(cfg):
    return cfg.pools[0]


@pytest.fixture
def fake():
    f = FakeGce().start()
    yield f
    f.stop()
    # A response the real message types refuse would have read as empty in the client.
    assert f.errors == []


def deploy(fake: FakeGce, cfg, pool, **kw) -> dict:
    args: dict[str, Any] = dict(project=PROJECT, region=REGION, name=MIG,
                                labels=naming.gcp_labels(cfg, pool), zones=ZONES, template=V1,
                                running=1, stopped=2, autoscaler=(1, 6), max_surge=3)
    args.update(kw)
    return fake.deploy_pool(**args)


@pytest.fixture
def ops(fake):
    return GcpOps(client_options={"api_endpoint": fake.endpoint},
                  credentials=AnonymousCredentials(), retry_initial_s=0.01,
                  retry_deadline_s=5)


def _calls(fake: FakeGce, method: str, fragment: str) -> list[dict]:
    return [r for r in fake.requests if r["method"] == method and fragment in r["path"]]


# -------------------------------------------------------------------------------------
# find_group


def test_find_group_by_template_labels_through_every_page(fake, ops, cfg, pool):
    # Decoys: another pool's MIG in the same region and an unlabelled group. Template
    # names sort before the pool's, so with 2 templates per page the pool's sits on page 3.
    other = cfg.model_copy(update={"project": "other"})
    fake.deploy_pool(project=PROJECT, region=REGION, name="aaa-other-pool",
                     labels=naming.gcp_labels(other, pool), zones=ZONES,
                     template="aaa-other-pool-t1", running=1)
    fake.deploy_pool(project=PROJECT, region=REGION, name="aab-hand-made", labels={},
                     zones=ZONES, template="aab-hand-made-t1", running=1, autoscaler=None)
    fake.add_template(PROJECT, "aac-unused", labels={})
    fake.add_template(PROJECT, "aad-unused", labels={})
    deploy(fake, cfg, pool)

    g = ops.find_group(cfg, pool)

    assert g == Group(cloud="gcp", name=MIG, region=REGION, min_nodes=1, max_nodes=6,
                      desired_nodes=1, warm_min_nodes=2, warm_state="stopped", version=V1,
                      raw_id=MIG_LINK, template=V1)
    tokens = [r["query"].get("pageToken") for r in _calls(fake, "GET", "/instanceTemplates")]
    # 5 templates at 2 per page: pages at offsets 0, 2, 4.
    assert tokens == [None, "2", "4"]
    # The MIG list pages too (3 MIGs): the pool's MIG is on the second page.
    assert [r["query"].get("pageToken") for r in
            _calls(fake, "GET", "/instanceGroupManagers") if r["path"].endswith("Managers")
            ] == [None, "2"]


def test_find_group_by_all_instances_config_labels(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    # A group built from an unlabelled template that labels its VMs itself.
    fake.templates[(PROJECT, V1)]["properties"]["labels"] = {}
    fake.migs[(PROJECT, REGION, MIG)]["allInstancesConfig"] = {
        "properties": {"labels": naming.gcp_labels(cfg, pool)}}
    assert ops.find_group(cfg, pool).name == MIG


def test_find_group_not_deployed_says_so(fake, ops, cfg, pool):
    fake.add_region(PROJECT, REGION, ZONES)
    with pytest.raises(OperationFailed) as e:
        ops.find_group(cfg, pool)
    msg = str(e.value)
    assert "\n" not in msg
    assert "poolctl-project=acme, poolctl-pool=chat-70b" in msg
    assert "`poolctl deploy --cloud gcp --pool chat-70b`" in msg


def test_find_group_refuses_two_groups(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    fake.deploy_pool(project=PROJECT, region=REGION, name="acme-chat-70b-copy",
                     labels=naming.gcp_labels(cfg, pool), zones=ZONES, template="copy-t1")
    with pytest.raises(OperationFailed, match=r"2 MIGs .*acme-chat-70b, acme-chat-70b-copy"):
        ops.find_group(cfg, pool)


def test_find_group_unknown_region_names_the_key(fake, ops, cfg, pool):
    fake.add_project(PROJECT)
    with pytest.raises(OperationFailed, match=r"^gcp.region: region 'us-central1' not found"):
        ops.find_group(cfg, pool)


def test_running_warm_pool_is_read_out_of_the_autoscaler_minimum(fake, ops):
    # warm_pool.state running: the stack folds 2 warm nodes into the autoscaler (min 1 + 2,
    # max 6 + 2) and keeps no standby pool.
    cfg = parse_config(pool_yaml(warm_state="running"))
    pool = cfg.pools[0]
    deploy(fake, cfg, pool, running=3, stopped=0, autoscaler=(3, 8))
    g = ops.find_group(cfg, pool)
    assert (g.min_nodes, g.warm_min_nodes, g.warm_state, g.max_nodes) == (1, 2, "running", 8)


# -------------------------------------------------------------------------------------
# nodes


@pytest.mark.parametrize("status, action, target, health, phase", [
    ("RUNNING", "NONE", "RUNNING", ["HEALTHY"], "in_service"),
    ("RUNNING", "NONE", "RUNNING", [], "in_service"),  # no autohealing check
    ("RUNNING", "NONE", "RUNNING", ["UNHEALTHY"], "unhealthy"),
    ("RUNNING", "NONE", "RUNNING", ["TIMEOUT"], "unhealthy"),
    ("RUNNING", "NONE", "RUNNING", ["UNKNOWN"], "pending"),  # autohealing initial delay
    ("RUNNING", "NONE", "RUNNING", ["DRAINING"], "terminating"),
    ("RUNNING", "VERIFYING", "RUNNING", [], "pending"),
    ("PROVISIONING", "CREATING", "RUNNING", [], "pending"),
    ("PROVISIONING", "CREATING", "STOPPED", [], "pending"),  # a standby VM being made
    ("RUNNING", "NONE", "STOPPED", [], "pending"),  # standby first boot, then stopped
    ("TERMINATED", "NONE", "STOPPED", [], "warm"),  # GCE's word for a stopped VM
    ("STOPPED", "NONE", "STOPPED", [], "warm"),
    ("SUSPENDED", "NONE", "SUSPENDED", [], "warm"),
    ("TERMINATED", "STARTING", "RUNNING", [], "pending"),  # scale-out from the standby pool
    ("RUNNING", "STOPPING", "STOPPED", [], "pending"),
    ("RUNNING", "DELETING", "DELETED", ["HEALTHY"], "terminating"),
    ("RUNNING", "ABANDONING", "ABANDONED", ["HEALTHY"], "terminating"),
    ("RUNNING", "RECREATING", "RUNNING", ["HEALTHY"], "pending"),
])
def test_node_phase(status, action, target, health, phase):
    assert node_phase(status, action, target, health) == phase


def test_nodes_from_list_managed_instances(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    mis = fake.instances(PROJECT, REGION, MIG)
    serving, standby = mis[0]["name"], mis[1]["name"]
    fake.set_health(serving, "UNHEALTHY")
    g = ops.find_group(cfg, pool)

    nodes = {n.id: n for n in ops.nodes(g)}

    assert len(nodes) == 3
    assert nodes[serving].phase == "unhealthy"
    assert nodes[serving].state == "RUNNING/NONE/UNHEALTHY"
    assert nodes[standby].phase == "warm"
    assert nodes[standby].state == "TERMINATED/NONE->STOPPED"
    assert {n.version for n in nodes.values()} == {V1}  # `?uniqueId=` dropped
    assert {n.zone for n in nodes.values()} <= set(ZONES)
    assert nodes[serving].zone == mis[0]["instance"].split("/zones/")[1].split("/")[0]


# -------------------------------------------------------------------------------------
# quota


def _seed_quotas(fake):
    # Region: H100 16 granted, 8 in use (the pool's one serving node); CPUS 2,000 granted,
    # 208 of the pool + 100 of others; Local SSD 60,000 granted, 6,000 of the pool.
    fake.add_region(PROJECT, REGION, ZONES, quotas={
        "NVIDIA_H100_GPUS": (16, 8), "CPUS": (2000, 308), "LOCAL_SSD_TOTAL_GB": (60000, 6000),
    })
    fake.set_project_quota(PROJECT, "GPUS_ALL_REGIONS", 64, 8)


def test_quota_lines_hand_computed(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    lines = {ln.name: ln.to_json() for ln in
             ops.quota_lines(cfg, pool, plan_pool(pool, "gcp").quotas)}

    h100 = lines["NVIDIA_H100_GPUS"]
    assert (h100["scope"], h100["needed"], h100["granted"], h100["in_use"]) == (
        REGION, 72, 16.0, 8.0)
    # The pool's one running node holds 8 of the 8 in use (its 2 stopped standby VMs hold
    # none): 72 + 8 - 8 - 16 = 56 short.
    assert (h100["pool_in_use"], h100["shortfall"], h100["ok"]) == (8.0, 56.0, False)
    cpus = lines["CPUS"]
    # 1,872 + 308 - 208 - 2,000 = -28 -> fits.
    assert (cpus["needed"], cpus["pool_in_use"], cpus["shortfall"], cpus["ok"]) == (
        1872, 208.0, 0, True)
    ssd = lines["LOCAL_SSD_TOTAL_GB"]
    # 54,000 + 6,000 - 6,000 - 60,000 = -6,000 -> fits.
    assert (ssd["needed"], ssd["pool_in_use"], ssd["ok"]) == (54000, 6000.0, True)
    allr = lines["GPUS_ALL_REGIONS"]
    # Global: 72 + 8 - 8 - 64 = 8 short.
    assert (allr["scope"], allr["granted"], allr["shortfall"]) == ("global", 64.0, 8.0)
    # GPUS_ALL_REGIONS is the project's (projects.get), the rest the region's.
    assert len([r for r in fake.requests if r["path"].endswith(f"/projects/{PROJECT}")]) == 1


def test_quota_line_missing_metric_grants_nothing(fake, ops, cfg, pool):
    fake.add_region(PROJECT, REGION, ZONES, quotas={"CPUS": (24, 0)})
    from poolctl.sizing import QuotaNeed

    (line,) = ops.quota_lines(cfg, pool, [QuotaNeed("NVIDIA_H100_GPUS", "GPU", 72, REGION)])
    assert (line.granted, line.in_use, line.pool_in_use, line.shortfall) == (0.0, 0.0, 0, 72)
    assert "lists no NVIDIA_H100_GPUS quota in us-central1" in line.description


def test_cloud_quota_ids():
    assert cloud_quota("NVIDIA_H100_GPUS", REGION) == (
        "GPUS-PER-GPU-FAMILY-per-project-region",
        {"region": REGION, "gpu_family": "NVIDIA_H100"})
    assert cloud_quota("NVIDIA_A100_80GB_GPUS", REGION)[1]["gpu_family"] == "NVIDIA_A100_80GB"
    assert cloud_quota("CPUS", REGION) == ("CPUS-per-project-region", {"region": REGION})
    assert cloud_quota("GPUS_ALL_REGIONS", "global") == ("GPUS-ALL-REGIONS-per-project", {})
    assert cloud_quota("SNAPSHOTS", "global") is None


def test_request_quota_files_once_then_raises_then_follows_the_grant(fake, ops, cfg, pool,
                                                                       monkeypatch):
    monkeypatch.setenv("POOLCTL_QUOTA_CONTACT_EMAIL", "gpu-team@example.com")
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    lines = {ln.name: ln for ln in ops.quota_lines(cfg, pool, plan_pool(pool, "gcp").quotas)}
    h100 = lines["NVIDIA_H100_GPUS"]

    # granted 16 + shortfall 56 = 72
    first = ops.request_quota(h100, h100.granted + h100.shortfall)
    name = ("projects/acme-prod/locations/global/quotaPreferences/"
            "poolctl-nvidia-h100-gpus-us-central1")
    assert first.to_json() == {"name": "NVIDIA_H100_GPUS", "scope": REGION, "desired": 72,
                               "id": name, "state": "PENDING", "already_open": False}
    (create,) = _calls(fake, "POST", "/quotaPreferences")
    assert create["query"]["quotaPreferenceId"] == "poolctl-nvidia-h100-gpus-us-central1"
    body = create["body"]
    assert body["service"] == "compute.googleapis.com"
    assert body["quotaId"] == "GPUS-PER-GPU-FAMILY-per-project-region"
    assert body["dimensions"] == {"region": REGION, "gpu_family": "NVIDIA_H100"}
    assert body["quotaConfig"]["preferredValue"] in ("72", 72)
    assert body["contactEmail"] == "gpu-team@example.com"

    again = ops.request_quota(h100, 72)
    assert (again.id, again.already_open, again.state) == (name, True, "PENDING")
    assert len(fake.preferences) == 1 and len(_calls(fake, "POST", "/quotaPreferences")) == 1

    # A larger need raises the same preference instead of filing a second one.
    raised = ops.request_quota(h100, 80)
    assert (raised.id, raised.desired, raised.already_open) == (name, 80, False)
    (patch,) = _calls(fake, "PATCH", "/quotaPreferences/")
    # The REST transport sends the mask in JSON (camelCase) names.
    assert set(patch["query"]["updateMask"].split(",")) == {
        "quotaConfig.preferredValue", "contactEmail", "justification"}
    assert len(fake.preferences) == 1

    fake.grant(name)
    granted = ops.request_quota(h100, 80)
    assert (granted.state, granted.already_open) == ("GRANTED", True)
    (after,) = [ln for ln in ops.quota_lines(cfg, pool, plan_pool(pool, "gcp").quotas)
                if ln.name == "NVIDIA_H100_GPUS"]
    assert (after.granted, after.shortfall) == (80.0, 0)


def test_request_quota_global_and_contact_required(fake, ops, cfg, pool, monkeypatch):
    monkeypatch.delenv("POOLCTL_QUOTA_CONTACT_EMAIL", raising=False)
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    lines = {ln.name: ln for ln in ops.quota_lines(cfg, pool, plan_pool(pool, "gcp").quotas)}
    with pytest.raises(UsageError, match=r"^--contact-email: Cloud Quotas requires .*"
                                         r"POOLCTL_QUOTA_CONTACT_EMAIL"):
        ops.request_quota(lines["GPUS_ALL_REGIONS"], 72)
    assert fake.preferences == {}

    ops2 = GcpOps(client_options={"api_endpoint": fake.endpoint}, contact_email="a@b.example")
    ops2.quota_lines(cfg, pool, plan_pool(pool, "gcp").quotas)
    req = ops2.request_quota(lines["GPUS_ALL_REGIONS"], 72)
    pref = fake.preferences[req.id]
    assert (pref["quotaId"], pref.get("dimensions", {})) == ("GPUS-ALL-REGIONS-per-project", {})


# -------------------------------------------------------------------------------------
# set_capacity


def test_set_capacity_stopped_standby_waits_for_the_operation(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)

    ops.set_capacity(g, min_nodes=1, warm_nodes=3, warm_running=False)

    # The fake applies a patch only when its operation reaches DONE, which takes two
    # operations.wait calls: the new size being there proves set_capacity waited.
    assert fake.migs[(PROJECT, REGION, MIG)]["targetStoppedSize"] == 3
    (patch,) = _calls(fake, "PATCH", "/instanceGroupManagers/")
    assert patch["body"] == {"targetStoppedSize": 3, "standbyPolicy": {"mode": "SCALE_OUT_POOL"}}
    assert patch["query"]["requestId"]  # retried patches are not applied twice
    assert len(_calls(fake, "POST", "/wait")) == 2
    assert _calls(fake, "PATCH", "/autoscalers") == []  # minimum unchanged: left alone
    phases = sorted(n.phase for n in ops.nodes(g))
    assert phases == ["in_service", "pending", "warm", "warm"]  # the third is being made
    fake.settle()
    assert sorted(n.phase for n in ops.nodes(g)) == ["in_service", "warm", "warm", "warm"]
    assert ops.find_group(cfg, pool).warm_min_nodes == 3


def test_set_capacity_running_warm_raises_the_autoscaler_and_starts_standby(fake, ops, cfg,
                                                                            pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    standby = {mi["name"] for mi in fake.instances(PROJECT, REGION, MIG)
               if mi["targetStatus"] == "STOPPED"}

    ops.set_capacity(g, min_nodes=1, warm_nodes=3, warm_running=True)

    a = fake.autoscalers[(PROJECT, REGION, MIG)]["autoscalingPolicy"]
    assert (a["minNumReplicas"], a["maxNumReplicas"]) == (4, 6)  # 1 + 3 running warm
    (apatch,) = _calls(fake, "PATCH", "/autoscalers")
    assert apatch["query"]["autoscaler"] == MIG
    assert apatch["body"]["autoscalingPolicy"] == {"minNumReplicas": 4, "maxNumReplicas": 6}
    # The policy's metric survived the merge patch.
    assert a["customMetricUtilizations"][0]["metric"] == naming.GCP_METRIC_TYPE
    m = fake.migs[(PROJECT, REGION, MIG)]
    assert (m["targetStoppedSize"], m["targetSize"]) == (0, 4)
    # SCALE_OUT_POOL: the 2 stopped VMs start first, then 1 more is created.
    starting = {mi["name"] for mi in fake.instances(PROJECT, REGION, MIG)
                if mi["currentAction"] == "STARTING"}
    assert starting == standby
    fake.settle()
    assert [n.phase for n in ops.nodes(g)].count("in_service") == 4

    # Beyond the autoscaler's maximum: the maximum follows (5 + 3 = 8 > 6).
    ops.set_capacity(g, min_nodes=5, warm_nodes=3, warm_running=True)
    a = fake.autoscalers[(PROJECT, REGION, MIG)]["autoscalingPolicy"]
    assert (a["minNumReplicas"], a["maxNumReplicas"]) == (8, 8)


def test_set_capacity_without_autoscaler_resizes(fake, ops, cfg, pool):
    deploy(fake, cfg, pool, autoscaler=None)
    g = ops.find_group(cfg, pool)
    assert (g.min_nodes, g.max_nodes) == (1, 1)  # the target size stands in for both

    ops.set_capacity(g, min_nodes=2, warm_nodes=2, warm_running=False)
    (resize,) = _calls(fake, "POST", "/resize")
    assert resize["query"]["size"] == "2"
    assert fake.migs[(PROJECT, REGION, MIG)]["targetSize"] == 2

    ops.set_capacity(g, min_nodes=1, warm_nodes=2, warm_running=False, desired_nodes=1)
    assert fake.migs[(PROJECT, REGION, MIG)]["targetSize"] == 1


def test_failed_operation_is_one_clear_line(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    fake.fail_next_operation("/instanceGroupManagers/acme-chat-70b$")
    with pytest.raises(OperationFailed) as e:
        ops.set_capacity(g, min_nodes=1, warm_nodes=5, warm_running=False)
    assert str(e.value) == ("GCP patch MIG acme-chat-70b (standby 5): QUOTA_EXCEEDED: "
                            "Quota 'NVIDIA_H100_GPUS' exceeded.")
    assert fake.migs[(PROJECT, REGION, MIG)]["targetStoppedSize"] == 2


def test_minimum_above_the_maximum_raises_the_maximum(fake, ops, cfg, pool):
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    # The API refuses an autoscaler whose minimum exceeds its maximum (6)...
    client = ops.client("RegionAutoscalersClient")
    with pytest.raises(gexc.BadRequest, match="minNumReplicas"):
        client.patch_unary(request=compute_v1.PatchRegionAutoscalerRequest(
            project=PROJECT, region=REGION, autoscaler=MIG,
            autoscaler_resource=compute_v1.Autoscaler(
                autoscaling_policy=compute_v1.AutoscalingPolicy(min_num_replicas=7))))
    # ...so set_capacity raises the maximum with it: 7 (no warm running) -> 7..7.
    ops.set_capacity(g, min_nodes=7, warm_nodes=2, warm_running=False)
    a = fake.autoscalers[(PROJECT, REGION, MIG)]["autoscalingPolicy"]
    assert (a["minNumReplicas"], a["maxNumReplicas"]) == (7, 7)


# -------------------------------------------------------------------------------------
# retries


def test_transient_errors_are_retried(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    fake.fail_next("GET", "/global/instanceTemplates$", status=429)
    fake.fail_next("GET", "/instanceGroupManagers$", status=503, times=2)
    assert ops.find_group(cfg, pool).name == MIG
    assert len(_calls(fake, "GET", "/global/instanceTemplates")) == 2  # 429, then 1 page
    lists = [r for r in _calls(fake, "GET", "/instanceGroupManagers")
             if r["path"].endswith("Managers")]
    assert len(lists) == 3  # 503, 503, then the one page


def test_persistent_errors_end_in_one_line(fake, cfg, pool):
    deploy(fake, cfg, pool)
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint}, retry_initial_s=0.01,
                 retry_deadline_s=0.3)
    fake.fail_next("GET", "/global/instanceTemplates$", status=503, times=10_000)
    t0 = time.monotonic()
    with pytest.raises(OperationFailed, match="^GCP list instance templates: still failing "
                                              "after retries"):
        ops.find_group(cfg, pool)
    assert time.monotonic() - t0 < 10


def test_permission_error_is_not_retried(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    fake.fail_next("GET", "/global/instanceTemplates$", status=403)
    with pytest.raises(OperationFailed, match="^GCP list instance templates: 403 "):
        ops.find_group(cfg, pool)
    assert len(_calls(fake, "GET", "/global/instanceTemplates")) == 1


# -------------------------------------------------------------------------------------
# rollouts


def test_no_rollout_on_a_fresh_pool(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    assert ops.rollout_state(g) is None
    with pytest.raises(OperationFailed, match="no earlier instance template of the pool"):
        ops.rollout_rollback(g)
    # A `deploy` that wrote a new template rolls nothing (the MIG's versions are
    # poolctl's): still no rollout, until `rollout start` begins one towards it.
    fake.add_template(PROJECT, V2, labels=naming.gcp_labels(cfg, pool))
    assert ops.rollout_state(g) is None
    s = ops.rollout_begin(g, cfg, pool, plan_pool(pool, "gcp"), no_surge=False,
                          stack_dir=None)
    assert (s.id, s.step, s.from_version) == (V2, 25, V1)


# Canary rollouts. The pool serves on 4 VMs with 2 standby VMs (6 in all), checkpoints
# [25, 50, 100] with no checkpoint delay. By hand: the canary at 25 % of the group's 4
# serving VMs is 1 VM, at 50 % 2 VMs (the percentage of the target size, rounded up); the
# last step points the MIG at V2 alone, which replaces the other 4 (2 serving, 2 standby).
V1_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/instanceTemplates/{V1}"
V2_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/instanceTemplates/{V2}"


@pytest.fixture
def cfg0():
    return parse_config(pool_yaml(checkpoints="[25, 50, 100]\n      checkpoint_delay_s: 0"))


def _canary_pool(fake, ops, cfg):
    """The pool deployed (4 serving, 2 standby on V1) and the apply of `rollout start`
    done: V2 exists, the MIG untouched. Returns the group as found before."""
    pool = cfg.pools[0]
    deploy(fake, cfg, pool, running=4, stopped=2)
    g = ops.find_group(cfg, pool)
    fake.add_template(PROJECT, V2, labels=naming.gcp_labels(cfg, pool))
    return g


def _versions(fake) -> list[dict]:
    """The MIG's versions as stored: name, template, target size (without `calculated`)."""
    return [{"name": v["name"], "template": _last_name(v["instanceTemplate"]),
             **({"targetSize": {k: n for k, n in v["targetSize"].items() if k != "calculated"}}
                if v.get("targetSize") else {})}
            for v in fake.migs[(PROJECT, REGION, MIG)]["versions"]]


def _last_name(link: str) -> str:
    return link.split("?", 1)[0].rsplit("/", 1)[1]


def _row(name, template, target, nodes, healthy, unhealthy=0, pending=0) -> VersionRow:
    return VersionRow(name=name, template=template, target=target, nodes=nodes,
                      healthy=healthy, unhealthy=unhealthy, pending=pending)


def _to_step(fake, ops, g, cfg, step: int):
    """Begin, and drive the canary to `step` (25, 50 or 100) with every VM healthy."""
    pool = cfg.pools[0]
    s = ops.rollout_begin(g, cfg, pool, plan_pool(pool, Cloud.gcp), no_surge=False, stack_dir=None)
    while s.step < step:
        fake.step_rollout(PROJECT, REGION, MIG, 6)
        s = ops.rollout_state(g)
        assert ops.rollout_advance(g, s) is not None
        s = ops.rollout_state(g)
    return s


def test_canary_steps_through_each_checkpoint(fake, ops, cfg0):
    pool = cfg0.pools[0]
    g = _canary_pool(fake, ops, cfg0)
    assert fake.migs[(PROJECT, REGION, MIG)]["versions"][0]["name"] == "primary"

    s = ops.rollout_begin(g, cfg0, pool, plan_pool(pool, "gcp"), no_surge=False,
                          stack_dir=None)

    (patch,) = _calls(fake, "PATCH", "/instanceGroupManagers/")
    assert patch["body"] == {"versions": [
        {"name": "stable", "instanceTemplate": fake.migs[(PROJECT, REGION, MIG)][
            "versions"][0]["instanceTemplate"]},
        {"name": "canary", "instanceTemplate": V2_LINK, "targetSize": {"percent": 25}}]}
    assert patch["body"]["versions"][0]["instanceTemplate"].startswith(V1_LINK + "?uniqueId=")
    # Step 25: 1 canary VM wanted, none yet; of the 4 serving VMs one is being recreated
    # (pending), 3 healthy; 2 standby VMs stopped.
    assert (s.id, s.status, s.done, s.step, s.checkpoints, s.checkpoint_reached) == (
        V2, "in_progress", False, 25, [25, 50, 100], None)
    assert (s.from_version, s.to_version, s.percentage_complete, s.instances_to_update) == (
        V1, V2, 0.0, 1)
    assert s.versions == [_row("stable", V1, None, 6, 3, pending=1),
                          _row("canary", V2, 1, 0, 0)]
    assert ops.rollout_advance(g, s) is None

    # The canary VM is created: not healthy yet, so the step is not reached.
    assert fake.step_rollout(PROJECT, REGION, MIG, 6, settled=False) == 1
    s = ops.rollout_state(g)
    assert s.versions == [_row("stable", V1, None, 5, 3), _row("canary", V2, 1, 1, 0, pending=1)]
    assert (s.checkpoint_reached, s.percentage_complete) == (None, 16.7)  # 1 of 6 VMs
    assert ops.rollout_advance(g, s) is None
    assert len(_calls(fake, "PATCH", "/instanceGroupManagers/")) == 1

    fake.settle()
    s = ops.rollout_state(g)
    assert (s.checkpoint_reached, s.reason) == (25, "canary 25%: 1 of 1 node(s) healthy")
    assert ops.rollout_advance(g, s) == (
        f"checkpoint 25% reached (1 healthy node(s) on {V2}); next step 50%")
    assert _versions(fake)[1] == {"name": "canary", "template": V2,
                                  "targetSize": {"percent": 50}}

    # Step 50: 2 canary VMs wanted, 1 there; the 25 % checkpoint stays reached.
    s = ops.rollout_state(g)
    assert (s.step, s.checkpoint_reached, s.instances_to_update) == (50, 25, 1)
    assert s.versions[1] == _row("canary", V2, 2, 1, 1)
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    s = ops.rollout_state(g)
    assert (s.checkpoint_reached, s.percentage_complete) == (50, 33.3)  # 2 of 6
    assert ops.rollout_advance(g, s).endswith("next step 100%")
    assert _versions(fake) == [{"name": "primary", "template": V2}]

    # Step 100: V2 alone; 2 serving and 2 standby VMs left on V1, 3 of them (the surge)
    # being recreated.
    s = ops.rollout_state(g)
    assert (s.status, s.step, s.checkpoint_reached, s.instances_to_update,
            s.percentage_complete) == ("in_progress", 100, 50, 4, 33.3)
    assert s.versions == [_row("stable", V1, None, 4, 0, pending=3),
                          _row("primary", V2, None, 2, 2)]
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    s = ops.rollout_state(g)
    assert (s.status, s.done, s.checkpoint_reached, s.percentage_complete,
            s.from_version, s.to_version) == ("successful", True, 100, 100.0, V1, V2)
    assert s.versions == [_row("primary", V2, None, 6, 4)]
    assert ops.rollout_advance(g, s) is None
    assert len(_calls(fake, "PATCH", "/instanceGroupManagers/")) == 3


def test_checkpoint_delay_holds_the_step(fake, ops, cfg, monkeypatch):
    # The file's checkpoint_delay_s (300 s by default) passes before the next step.
    pool = cfg.pools[0]
    g = _canary_pool(fake, ops, cfg)
    now = [1000.0]
    monkeypatch.setattr(gcp.time, "monotonic", lambda: now[0])
    ops.rollout_begin(g, cfg, pool, plan_pool(pool, "gcp"), no_surge=False, stack_dir=None)
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    s = ops.rollout_state(g)
    assert s.checkpoint_reached == 25
    assert ops.rollout_advance(g, s) is None  # reached now: the delay starts
    now[0] += 299
    assert ops.rollout_advance(g, ops.rollout_state(g)) is None
    now[0] += 1
    assert ops.rollout_advance(g, ops.rollout_state(g)).endswith("next step 50%")


@pytest.mark.parametrize("step", [25, 50, 100])
def test_rollback_at_each_step(fake, ops, cfg0, step):
    g = _canary_pool(fake, ops, cfg0)
    _to_step(fake, ops, g, cfg0, step)
    fake.step_rollout(PROJECT, REGION, MIG, 1)  # the step under way
    on_v2 = sum(_last_name(mi["version"]["instanceTemplate"]) == V2
                for mi in fake.instances(PROJECT, REGION, MIG))
    assert on_v2 == {25: 1, 50: 2, 100: 3}[step]

    back = ops.rollout_rollback(g)

    assert _versions(fake) == [{"name": "rollback", "template": V1}]
    # The rollback keeps the rollout's id and names: from V1 (where it returns), to V2.
    assert (back.id, back.status, back.done, back.from_version, back.to_version,
            back.instances_to_update) == (V2, "rolling_back", False, V1, V2, on_v2)
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    s = ops.rollout_state(g)
    assert (s.id, s.status, s.done, s.percentage_complete) == (
        V2, "rolled_back", True, 100.0)
    assert ops.rollout_advance(g, s) is None
    with pytest.raises(OperationFailed, match=f"already rolled back to {V1}"):
        ops.rollout_rollback(g)


@pytest.mark.parametrize("step, held", [
    (25, {"percent": 25}), (50, {"percent": 50}),
    # During the last step the split is the VMs already on V2: 2 + the 1 replaced.
    (100, {"fixed": 3})])
def test_cancel_holds_the_split_at_each_step(fake, ops, cfg0, step, held):
    pool = cfg0.pools[0]
    g = _canary_pool(fake, ops, cfg0)
    _to_step(fake, ops, g, cfg0, step)
    fake.step_rollout(PROJECT, REGION, MIG, 1)

    s = ops.rollout_cancel(g)

    assert _versions(fake) == [{"name": "stable", "template": V1},
                               {"name": "canary-held", "template": V2, "targetSize": held}]
    assert (s.id, s.status, s.done, s.step) == (V2, "cancelled", True, step)
    assert "held by `rollout cancel`" in s.reason
    split = [(mi["name"], _last_name(mi["version"]["instanceTemplate"]))
             for mi in fake.instances(PROJECT, REGION, MIG)]
    # Held: nothing is recreating, nothing moves on, the VMs stay where they are.
    assert fake.render_mig((PROJECT, REGION, MIG))["currentActions"]["recreating"] == 0
    assert ops.rollout_advance(g, s) is None
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    assert [(mi["name"], _last_name(mi["version"]["instanceTemplate"]))
            for mi in fake.instances(PROJECT, REGION, MIG)] == split

    # `rollout start` with the same version (a no-op apply) drives it on from there.
    s = ops.rollout_begin(g, cfg0, pool, plan_pool(pool, "gcp"), no_surge=False,
                          stack_dir=None)
    assert (s.status, s.done, s.step) == ("in_progress", False, step)
    assert _versions(fake)[-1] == ({"name": "primary", "template": V2} if step == 100 else
                                   {"name": "canary", "template": V2, "targetSize": held})

    # Held again, then rolled back: the old template alone.
    ops.rollout_cancel(g)
    back = ops.rollout_rollback(g)
    assert _versions(fake) == [{"name": "rollback", "template": V1}]
    assert (back.id, back.status) == (V2, "rolling_back")


def test_unhealthy_canary_rolls_back(fake, ops, cfg0):
    g = _canary_pool(fake, ops, cfg0)
    pool = cfg0.pools[0]
    ops.rollout_begin(g, cfg0, pool, plan_pool(pool, "gcp"), no_surge=False, stack_dir=None)
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    (canary,) = [mi["name"] for mi in fake.instances(PROJECT, REGION, MIG)
                 if _last_name(mi["version"]["instanceTemplate"]) == V2]
    fake.set_health(canary, "UNHEALTHY")
    s = ops.rollout_state(g)
    assert (s.checkpoint_reached, s.versions[1].unhealthy) == (None, 1)
    assert s.reason == "canary 25%: 0 of 1 node(s) healthy, 1 unhealthy"

    assert ops.rollout_advance(g, s) == (
        f"canary 25%: 1 node(s) of {V2} unhealthy; rolling back to {V1}")
    assert _versions(fake) == [{"name": "rollback", "template": V1}]
    assert ops.rollout_state(g).status == "rolling_back"


def test_fake_refuses_versions_gce_refuses(fake, ops, cfg0):
    g = _canary_pool(fake, ops, cfg0)
    with pytest.raises(OperationFailed, match="400 .*exactly one without a targetSize"):
        ops._set_versions(g, V1_LINK, V2_LINK, compute_v1.FixedOrPercent(percent=25),
                          name="stable")  # two versions named alike
    assert _versions(fake) == [{"name": "primary", "template": V1}]


def test_rollout_begin_without_a_new_template_is_none(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    assert ops.rollout_begin(g, cfg, pool, plan_pool(pool, "gcp"), no_surge=False,
                             stack_dir=None) is None


def test_rollback_when_the_old_template_is_gone(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    fake.add_template(PROJECT, V2, labels=naming.gcp_labels(cfg, pool))
    fake.set_template(PROJECT, REGION, MIG, V2)
    fake.delete_template(PROJECT, V1)  # as Terraform's create_before_destroy would
    with pytest.raises(OperationFailed, match=f"instance template {V1} no longer exists"):
        ops.rollout_rollback(g)
    assert fake.migs[(PROJECT, REGION, MIG)]["versions"][0]["instanceTemplate"].split(
        "?")[0].endswith(V2)


def test_rollout_apply_env_keeps_runtime_sizes(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    g = ops.find_group(cfg, pool)
    ops.set_capacity(g, min_nodes=1, warm_nodes=3, warm_running=False)
    g = ops.find_group(cfg, pool)
    plan = plan_pool(pool, "gcp")
    assert ops.rollout_apply_env(g, plan, no_surge=False) == {
        "TF_VAR_min_nodes": "1", "TF_VAR_max_nodes": "6", "TF_VAR_warm_nodes": "3"}
    # Without surge a regional MIG must take down 0 or >= 3 (zones) at a time.
    env = ops.rollout_apply_env(g, plan, no_surge=True)
    assert (env["TF_VAR_max_surge_fixed"], env["TF_VAR_max_unavailable_fixed"]) == ("0", "3")


# -------------------------------------------------------------------------------------
# The previous template survives the apply (see poolctl.clouds.gcp.rollout's module doc)


def _plan_change(address: str, rtype: str, actions: list[str], name: str = "") -> dict:
    """One entry of `terraform show -json`'s resource_changes."""
    return {"address": address, "type": rtype, "name": address.split(".")[-1],
            "change": {"actions": actions, "before": {"name": name} if name else None,
                       "after": {}}}


def test_replaced_templates_are_only_replacements():
    tpl = "google_compute_instance_template"
    plan = {"resource_changes": [
        _plan_change(f"{tpl}.nodes_template_A", tpl, ["create", "delete"], V1),
        _plan_change(f"{tpl}.fresh", tpl, ["create"]),  # first deploy: nothing to keep
        _plan_change(f"{tpl}.gone", tpl, ["delete"], "x"),  # removed from the config
        _plan_change(f"{tpl}.same", tpl, ["no-op"], "y"),
        _plan_change(f"{tpl}.reordered", tpl, ["delete", "create"], "z"),
        _plan_change("google_compute_region_instance_group_manager.mig",
                     "google_compute_region_instance_group_manager", ["update"], MIG),
        _plan_change("google_compute_region_health_check.hc",
                     "google_compute_region_health_check", ["create", "delete"], "hc"),
    ]}
    assert replaced_templates(plan) == [
        ForgottenTemplate(address=f"{tpl}.nodes_template_A", name=V1),
        ForgottenTemplate(address=f"{tpl}.reordered", name="z")]
    assert replaced_templates({}) == []  # an empty plan has no resource_changes


def test_deploy_forgets_the_template_the_mig_runs(cfg, pool, capsys):
    """`deploy` of a changed template on GCP: Terraform must not delete the template the
    MIG runs (its versions are poolctl's), so the step forgets it and says how to roll."""
    from poolctl import runtime

    tpl = "google_compute_instance_template.nodes_template_313A6F59"
    calls = []

    class Tf:
        def run(self, phase, *args, capture=False):
            calls.append(args)
            plan = {"resource_changes": [_plan_change(tpl, gcp.TEMPLATE_TYPE,
                                                      ["create", "delete"], V1)]}
            return SimpleNamespace(stdout=json.dumps(plan))

    assert runtime.deploy_before_apply([Target(pool, Cloud.aws)]) is None  # AWS stacks: no step
    step = runtime.deploy_before_apply([Target(pool, Cloud.aws), Target(pool, Cloud.gcp)])
    assert step(Tf()) is True  # the state changed: plan again
    assert calls == [("show", "-json", "tfplan"), ("state", "rm", tpl)]
    err = capsys.readouterr().err
    assert f"instance template {V1} stays: the pool's MIG runs it until `poolctl rollout " \
           "start --cloud gcp` rolls the new one" in err


@pytest.fixture
def tf_builtin(tmp_path, monkeypatch):
    """A real Terraform working directory whose `tpl` is replaced by the next plan.

    No Google provider is reachable offline, so Terraform's builtin `terraform_data` stands
    in for google_compute_instance_template (same lifecycle: create_before_destroy, a new
    object per change, referenced by a `mig`). The plan JSON, the replacement, the state
    removal and the second plan are Terraform's own."""
    from poolctl.terraform import Terraform

    if not (os.environ.get("POOLCTL_TERRAFORM") or shutil.which("terraform")
            or shutil.which("tofu")):
        pytest.skip("no terraform/tofu on PATH: the state removal needs the real CLI")
    monkeypatch.setattr(gcp, "TEMPLATE_TYPE", "terraform_data")
    monkeypatch.delenv("TF_CLI_CONFIG_FILE", raising=False)
    (tmp_path / "main.tf.json").write_text(json.dumps({
        "variable": {"image": {"type": "string", "default": "v0.11.0"}},
        "resource": {"terraform_data": {
            "tpl": {"triggers_replace": "${var.image}",
                    "lifecycle": {"create_before_destroy": True}},
            "mig": {"input": "${terraform_data.tpl.id}"}}}}))
    tf = Terraform(tmp_path)
    tf.init()
    tf.plan()
    tf.apply()
    return tf


def _state_ids(tf) -> dict[str, str]:
    state = json.loads(tf.run("show", "show", "-json", capture=True).stdout)
    return {r["address"]: r["values"]["id"]
            for r in state["values"]["root_module"]["resources"]}


def test_rollout_before_apply_forgets_the_replaced_template(tf_builtin):
    tf = tf_builtin
    before = _state_ids(tf)
    tf.env["TF_VAR_image"] = "v0.12.0"  # what `rollout start --image` changes
    # Without the step: the old object would be destroyed once the new one exists.
    assert tf.plan().totals() == (1, 1, 1)

    forgotten = GcpOps().rollout_before_apply(tf)

    assert forgotten == [ForgottenTemplate(address="terraform_data.tpl", name="")]
    # Planned again: the new one is created and the MIG moved to it; nothing is destroyed.
    assert tf.plan().totals() == (1, 1, 0)
    tf.apply()
    after = _state_ids(tf)
    assert after["terraform_data.tpl"] != before["terraform_data.tpl"]
    assert set(after) == {"terraform_data.tpl", "terraform_data.mig"}
    # An apply that changes no template forgets nothing.
    tf.env["TF_VAR_image"] = "v0.12.0"
    tf.plan()
    assert GcpOps().rollout_before_apply(tf) == []


def test_rollout_cleanup_keeps_current_previous_and_what_vms_run(fake, ops, cfg, pool):
    labels = naming.gcp_labels(cfg, pool)
    deploy(fake, cfg, pool, older_templates=(V0,))
    g = ops.find_group(cfg, pool)
    fake.add_template(PROJECT, "unrelated-template", labels={})
    # The apply of `rollout start`: V2 is created and targeted; V1, forgotten by Terraform,
    # is what all 3 VMs still run.
    fake.add_template(PROJECT, V2, labels=labels)
    fake.set_template(PROJECT, REGION, MIG, V2)

    out = ops.rollout_cleanup(g)

    assert out == TemplatesDeleted(deleted=[V0], failed=[])
    assert {n for p, n in fake.templates if p == PROJECT} == {V1, V2, "unrelated-template"}
    (delete,) = _calls(fake, "DELETE", "/instanceTemplates/")
    assert delete["path"].endswith(f"/global/instanceTemplates/{V0}")
    assert delete["query"]["requestId"]
    # The template went away when the global operation was DONE: the cleanup waited on it.
    assert len(_calls(fake, "POST", "/global/operations/")) == 2

    # Rolled back mid-rollout: V1 is the target again, V2 (newer) the previous; both stay.
    ops.rollout_rollback(g)
    fake.step_rollout(PROJECT, REGION, MIG, 3)
    assert ops.rollout_cleanup(g) == TemplatesDeleted(deleted=[], failed=[])

    # A third version: V1 (what the VMs run) and V3 stay, V2 goes.
    v3 = "acme-chat-70b-20260301090000000000000003"
    fake.add_template(PROJECT, v3, labels=labels)
    fake.set_template(PROJECT, REGION, MIG, v3)
    assert ops.rollout_cleanup(g) == TemplatesDeleted(deleted=[V2], failed=[])


def test_rollout_cleanup_reports_a_template_another_group_uses(fake, ops, cfg, pool):
    labels = naming.gcp_labels(cfg, pool)
    deploy(fake, cfg, pool, older_templates=(V0,))
    g = ops.find_group(cfg, pool)
    # A hand-made group built from the pool's old template: GCE refuses the delete.
    fake.deploy_pool(project=PROJECT, region=REGION, name="hand-made", labels={},
                     zones=ZONES, template="hand-made-t1", autoscaler=None)
    fake.set_template(PROJECT, REGION, "hand-made", V0)
    fake.add_template(PROJECT, V2, labels=labels)
    fake.set_template(PROJECT, REGION, MIG, V2)

    out = ops.rollout_cleanup(g)

    assert out.deleted == []
    (line,) = out.failed
    assert line.startswith(f"GCP delete instance template {V0}: 400 ")
    assert "already being used by" in line and line.endswith("delete it by hand once unused")
    assert (PROJECT, V0) in fake.templates


def _seed_rollout_quotas(fake):
    # Room for the rollout: 1 serving node + 3 surge = 4 nodes = 32 H100, 832 vCPUs.
    fake.add_region(PROJECT, REGION, ZONES, quotas={
        "NVIDIA_H100_GPUS": (64, 8), "CPUS": (2000, 208), "LOCAL_SSD_TOTAL_GB": (60000, 6000)})
    fake.set_project_quota(PROJECT, "GPUS_ALL_REGIONS", 64, 8)


def _start(cfg, cfg_file, pool, ops, tmp_path, image="vllm/vllm-openai:v0.12.0"):
    """`rollout start --image IMAGE`, every answer yes."""
    return start_rollout(cfg, cfg_file, pool, Cloud.gcp, ops, image=image,
                         outdir=tmp_path / "out")


def test_rollout_start_keeps_the_previous_template_for_a_rollback(fake, ops, cfg, pool,
                                                                  tmp_path, monkeypatch):
    """The workflow with Terraform stood in for: what `rollout start` passes to the apply,
    the state step before it, the cleanup after it, and a rollback mid-rollout to the
    template Terraform forgot."""
    from poolctl.commands.rollout import run_rollback
    from poolctl.workflow.rollout import RolloutRollback

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(pool_yaml())
    deploy(fake, cfg, pool, older_templates=(V0,))
    _seed_rollout_quotas(fake)
    ops.set_capacity(ops.find_group(cfg, pool), min_nodes=1, warm_nodes=3, warm_running=False)
    fake.settle()
    labels = naming.gcp_labels(cfg, pool)
    tpl_addr = "google_compute_instance_template.nodes_template_313A6F59"

    # The apply: V2 created; V1 left alone (Terraform forgot it); the MIG's versions
    # untouched (the stack ignores them).
    # The saved plan replaces V1.
    tf = PlanShown({"resource_changes": [_plan_change(tpl_addr, gcp.TEMPLATE_TYPE,
                                                      ["create", "delete"], V1)]})
    stack = StoodInStack("acme-chat-70b-gcp", str(tmp_path), tf=tf,
                         on_apply=lambda: fake.add_template(PROJECT, V2, labels=labels))
    calls = stand_in(monkeypatch, stack)

    res = _start(cfg, cfg_file, pool, ops, tmp_path)

    [call] = calls
    # The apply keeps what `warm` set (3 standby VMs) and the file's autoscaler bounds.
    assert call["extra_env"] == {"TF_VAR_min_nodes": "1", "TF_VAR_max_nodes": "6",
                                 "TF_VAR_warm_nodes": "3"}
    assert stack.steps == ["prepare", "plan", "replan", "apply", "finish"]
    assert tf.calls == [("show", "-json", "tfplan"), ("state", "rm", tpl_addr)]
    assert res.applied and res.rollout is not None
    # poolctl started the canary: V2 at the first checkpoint beside V1.
    assert (res.rollout.id, res.rollout.done, res.rollout.step) == (V2, False, 25)
    assert _versions(fake) == [{"name": "stable", "template": V1}, {
        "name": "canary", "template": V2, "targetSize": {"percent": 25}}]
    # Cleanup after the apply: V0 (two versions back) deleted, V1 and V2 kept.
    assert {n for p, n in fake.templates if p == PROJECT} == {V1, V2}
    assert "image: vllm/vllm-openai:v0.12.0" in cfg_file.read_text()

    # Mid-rollout rollback: the MIG goes back to V1, which still exists.
    fake.step_rollout(PROJECT, REGION, MIG, 1)
    asked = []
    out = run_rollback(RolloutRollback(cfg, cfg_file, pool, Cloud.gcp, ops,
                                       outdir=tmp_path / "out", mirror=None),
                       lambda q: asked.append(q) or True)
    assert out.how == "cloud_rollback"
    assert asked == ["roll back acme-chat-70b-gcp to serving.image=vllm/vllm-openai:v0.11.0 "
                     "(replaced nodes return to the previous version)?"]
    assert _versions(fake) == [{"name": "rollback", "template": V1}]
    assert "image: vllm/vllm-openai:v0.11.0" in cfg_file.read_text()


def test_rollout_start_again_drives_a_held_canary_on(fake, ops, cfg, pool, tmp_path,
                                                      monkeypatch):
    """`rollout start` with the version a held (or unwatched) canary rolls to drives it on
    where it stands, without another apply; another version is refused meanwhile."""
    from poolctl import runtime

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(pool_yaml())
    deploy(fake, cfg, pool, running=4, stopped=2)
    _seed_rollout_quotas(fake)
    calls = stand_in(monkeypatch, lambda new_cfg, targets: StoodInStack(
        "acme-chat-70b-gcp", str(tmp_path),
        on_apply=lambda: fake.add_template(PROJECT, V2, labels=naming.gcp_labels(cfg, pool))))
    res = _start(cfg, cfg_file, pool, ops, tmp_path)
    assert (res.rollout.step, len(calls)) == (25, 1)
    fake.step_rollout(PROJECT, REGION, MIG, 6)
    held = runtime.rollout_cancel(cfg, pool, "gcp", ops)
    assert (held.status, held.step) == ("cancelled", 25)

    # Driven on once, then left unwatched (`--no-wait`): another version is refused.
    ops.rollout_begin(ops.find_group(cfg, pool), cfg, pool, plan_pool(pool, "gcp"),
                      no_surge=False, stack_dir=None)
    with pytest.raises(OperationFailed, match="rollout .* is in progress"):
        _start(cfg, cfg_file, pool, ops, tmp_path, image="vllm/vllm-openai:v0.13.0")
    ops.rollout_cancel(ops.find_group(cfg, pool))

    cfg = parse_config(cfg_file.read_text())
    res = _start(cfg, cfg_file, pool, ops, tmp_path)

    assert len(calls) == 1  # no second apply
    assert (res.rollout.status, res.rollout.step, res.rollout.checkpoint_reached) == (
        "in_progress", 25, 25)
    assert _versions(fake)[-1] == {"name": "canary", "template": V2,
                                   "targetSize": {"percent": 25}}
    rec = runtime.load_record(cfg, pool, "gcp")
    assert (rec.status, rec.rollout_id, rec.from_value) == (
        "started", V2, "vllm/vllm-openai:v0.11.0")


def test_rollout_start_counts_the_pools_sharing_the_quota(fake, ops, cfg, pool, tmp_path,
                                                          monkeypatch):
    """Two pools of one file on A3 in one region share NVIDIA_H100_GPUS: the rollout's own
    need (1 serving node + 3 surge = 32 GPUs) fits the 64 granted alone, but beside the
    other pool's peak (9 nodes = 72 GPUs) it does not, and nothing is changed."""
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    two = pool_yaml() + pool_yaml().split("pools:\n", 1)[1].replace("chat-70b", "chat-b")
    cfg_file = tmp_path / "poolctl.yaml"
    cfg_file.write_text(two)
    cfg2 = parse_config(two)
    deploy(fake, cfg2, cfg2.pools[0])
    _seed_rollout_quotas(fake)
    with pytest.raises(OperationFailed) as e:
        _start(cfg2, cfg_file, cfg2.pools[0], ops, tmp_path)
    msg = str(e.value)
    # 32 + 72 = 104 needed beside 0 of others (8 in use are the pool's own): short by 40.
    assert "quota NVIDIA_H100_GPUS in us-central1: short by 40 GPU" in msg
    assert "chat-70b 32 + chat-b 72" in msg
    assert "image: vllm/vllm-openai:v0.11.0" in cfg_file.read_text()  # nothing changed
    assert _calls(fake, "PATCH", "/instanceGroupManagers/") == []


def test_wait_rollout_drives_the_checkpoints_then_cleans_up(fake, ops, cfg0, tmp_path,
                                                             monkeypatch):
    """`wait_rollout` steps the canary: 25 -> 50 -> 100 % as each step's VMs come up
    healthy (the fake replaces them while the command sleeps), then deletes what is neither
    current nor previous."""
    from poolctl import runtime

    pool = cfg0.pools[0]
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POOLCTL_POLL_S", "0")
    deploy(fake, cfg0, pool, older_templates=(V0,), running=4, stopped=2)
    g = ops.find_group(cfg0, pool)
    fake.add_template(PROJECT, V2, labels=naming.gcp_labels(cfg0, pool))
    ops.rollout_begin(g, cfg0, pool, plan_pool(pool, "gcp"), no_surge=False, stack_dir=None)
    # The record names the rollout in the file's words (states are annotated with them).
    runtime.save_record(cfg0, pool, "gcp", runtime.RolloutRecord(
        stack="s", pool=pool.name, cloud=Cloud.gcp, file="", key="serving.image",
        from_value="vllm/vllm-openai:v0.11.0", to_value="vllm/vllm-openai:v0.12.0",
        group_version_from=V1, group_version_to=V2, status="started", rollout_id=V2),
        new=True)

    def sleep(_):
        fake.step_rollout(PROJECT, REGION, MIG, 3)

    final, progress = runtime.wait_rollout(cfg0, pool, "gcp", ops, timeout=30, hint="h",
                                           sleep=sleep)
    assert (final.status, final.done, final.checkpoint_reached) == ("successful", True, 100)
    assert final.to_version == f"serving.image=vllm/vllm-openai:v0.12.0 ({V2})"
    assert runtime.load_record(cfg0, pool, "gcp").status == "successful"
    # Each poll: the step's VMs replaced (3 at a time, the surge), the step reached, the
    # next one patched. 6 VMs: 1 at 25 %, 2 at 50 %, then the other 4 (3, then 1).
    assert [(p.percentage_complete, p.checkpoint_reached) for p in progress] == [
        (0.0, None), (16.7, 25), (33.3, 50), (83.3, 50), (100.0, 100)]
    assert [v["name"] for v in fake.migs[(PROJECT, REGION, MIG)]["versions"]] == ["primary"]
    # Deleted once it ended: V0; V2 runs, V1 is the rollback target.
    assert {n for p, n in fake.templates if p == PROJECT} == {V1, V2}


# -------------------------------------------------------------------------------------
# the rest


def test_the_fakes_entry_point_seeds_the_story_example(fake, ops):
    """`python -m tests.fakes.gce examples/mistral-gcp/poolctl.yaml` (the README's
    walkthrough) deploys the pool as the stack does: min 16 replicas = 4 nodes, max 8, 8 warm
    replicas = 2 stopped standby nodes, surge 1 node raised to the 3 zones."""
    from poolctl.config import load_config
    from poolctl.contract.gcp import canary_steps
    from tests.fakes.gce import seed_pool

    story = load_config(Path(__file__).resolve().parents[2] / "examples" / "mistral-gcp"
                        / "poolctl.yaml")
    (p,) = story.pools
    seed_pool(fake, story, p)
    g = ops.find_group(story, p)
    assert (g.name, g.min_nodes, g.max_nodes, g.desired_nodes, g.warm_min_nodes,
            g.warm_state) == ("acme-mistral-24b", 4, 8, 4, 2, "stopped")
    mig = fake.migs[("acme-prod", "us-central1", "acme-mistral-24b")]
    assert mig["updatePolicy"]["maxSurge"]["fixed"] == 3
    assert len(mig["distributionPolicy"]["zones"]) == 3
    assert canary_steps(p) == [25, 50, 100]


def test_what_gcp_declares_it_can_do(ops):
    from poolctl.clouds import base

    # a canary can be held: cancel works; poolctl steps it and keeps its templates
    for can in (base.RequestsQuota, base.CancelsRollouts, base.RollsBackRollouts,
                base.PublishesQueueMetric, base.StepsRollouts, base.ReportsServing):
        assert isinstance(ops, can), can.__name__
    # the update's surge sits outside the autoscaler's maximum
    for cannot in (base.KeepsWarmSizes, base.BoundsGroupMaximum):
        assert not isinstance(ops, cannot), cannot.__name__


def _minute_ago() -> datetime:
    """The start of the minute before this one: points 10 s and 40 s into it stay inside
    that minute and inside the 10-minute window whatever the second is now."""
    now = datetime.now(UTC)
    return now.replace(second=0, microsecond=0) - timedelta(minutes=1)


def test_queue_is_the_newest_minute_mean_over_the_pools_vms(fake, ops, cfg, pool):
    deploy(fake, cfg, pool, running=3, stopped=0)
    fake.deploy_pool(project=PROJECT, region=REGION, name="acme-other",
                     labels={**naming.gcp_labels(cfg, pool), naming.LABEL_POOL: "other"},
                     zones=ZONES, template="acme-other-1", running=1)
    a, b, c = (mi["name"] for mi in fake.instances(PROJECT, REGION, MIG))
    (other,) = (mi["name"] for mi in fake.instances(PROJECT, REGION, "acme-other"))
    m = _minute_ago()
    fake.write_point(PROJECT, a, 100.0, m - timedelta(seconds=30))  # an older minute
    fake.write_point(PROJECT, a, 3.0, m + timedelta(seconds=10))
    fake.write_point(PROJECT, b, 6.5, m + timedelta(seconds=40))
    fake.write_point(PROJECT, c, 9.0, m - timedelta(minutes=20))  # outside the window
    fake.write_point(PROJECT, other, 50.0, m + timedelta(seconds=20))  # another pool's VM
    # The newest minute holds 3.0 (a) and 6.5 (b): (3.0 + 6.5) / 2 = 4.75.
    assert ops.queue_per_replica(ops.find_group(cfg, pool)) == 4.75
    calls = _calls(fake, "GET", "/timeSeries")
    assert {r["path"] for r in calls} == {f"/v3/projects/{PROJECT}/timeSeries"}
    q = calls[0]["query"]
    assert q["filter"] == ('metric.type = "custom.googleapis.com/poolctl/'
                           'requests_waiting_per_replica" AND resource.type = "gce_instance"')
    start = datetime.fromisoformat(q["interval.startTime"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(q["interval.endTime"].replace("Z", "+00:00"))
    assert end - start == timedelta(minutes=11)  # the last 10 minutes and 1 ahead
    # 3 series in the window (a, b, the other pool's VM; c's only point is too old) at 2 per
    # page: 2 pages, the second asked for with the first one's token.
    assert [r["query"].get("pageToken") for r in calls] == [None, "2"]


def test_queue_without_points_is_none_and_an_error_is_one_line(fake, ops, cfg, pool):
    deploy(fake, cfg, pool)
    (vm,) = (mi["name"] for mi in fake.instances(PROJECT, REGION, MIG)
             if mi["instanceStatus"] == "RUNNING")
    fake.write_point(PROJECT, vm, 2.0, _minute_ago() - timedelta(minutes=15))
    group = ops.find_group(cfg, pool)
    assert ops.queue_per_replica(group) is None
    fake.fail_next("GET", "/timeSeries$", 403)
    with pytest.raises(OperationFailed) as e:
        ops.queue_per_replica(group)
    assert str(e.value) == (
        "GCP Monitoring read custom.googleapis.com/poolctl/requests_waiting_per_replica of "
        f"{MIG}: 403 injected failure; the caller needs roles/monitoring.viewer on the project")


def test_endpoint_from_env_gets_anonymous_credentials(fake, cfg, pool, monkeypatch):
    from poolctl.commands.common import endpoints_of

    deploy(fake, cfg, pool)
    # Read once, at the CLI's edge; the library is handed it.
    monkeypatch.setenv("POOLCTL_GCE_ENDPOINT", fake.endpoint)
    endpoints = endpoints_of(False)
    assert endpoints.gce_url == fake.endpoint
    monkeypatch.delenv("POOLCTL_GCE_ENDPOINT")
    assert endpoints_of(False).gce_url is None
    # No credentials given and none in the environment: a plain-http endpoint is anonymous.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    assert make_ops(endpoints).find_group(cfg, pool).name == MIG
    with pytest.raises(UsageError, match="^--sandbox: the sandbox emulates AWS only"):
        make_ops(CloudEndpoints(flag="--sandbox", clouds=frozenset({Cloud.aws})))


def test_missing_credentials_is_a_usage_error(cfg, pool, monkeypatch, tmp_path):
    monkeypatch.delenv("POOLCTL_GCE_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(Exception) as e:
        GcpOps().find_group(cfg, pool)
    # google-auth refuses a missing key file with DefaultCredentialsError -> exit 2, one line.
    assert isinstance(e.value, UsageError)
    assert str(e.value).startswith("GCP credentials: none found")


def test_fake_refuses_a_misspelt_field(fake, cfg, pool):
    # The check behind `fake.errors == []`: a field the real message lacks is caught.
    deploy(fake, cfg, pool)
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint}, retry_initial_s=0.01,
                 retry_deadline_s=0.2)
    fake.migs[(PROJECT, REGION, MIG)]["targetStopedSize"] = 2
    with pytest.raises(OperationFailed) as e:
        ops.find_group(cfg, pool)
    assert "\n" not in str(e.value)
    assert 'has no field named "targetStopedSize"' in str(e.value)
    assert any("targetStopedSize" in e for e in fake.errors)
    fake.errors.clear()


# -------------------------------------------------------------------------------------
# The CLI end to end: `python -m poolctl ... --cloud gcp` in a subprocess, pointed at the
# fake through POOLCTL_GCE_ENDPOINT (plain http: anonymous credentials).


@pytest.fixture
def home(tmp_path):
    return tmp_path / "poolctl-home"


@pytest.fixture
def cfg_file(tmp_path):
    p = tmp_path / "poolctl.yaml"
    p.write_text(pool_yaml())
    return p


def cli(fake: FakeGce, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POOLCTL_GCE_ENDPOINT": fake.endpoint, "POOLCTL_HOME": str(home),
           "POOLCTL_POLL_S": "0.05"}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    return inproc.run(args, env=env, timeout=120)  # in this worker: tests/inproc.py


def after_patch_polls(fake: FakeGce, polls: int, then, deadline_s: float = 60):
    """Run `then()` in a thread once the CLI has patched the MIG and then listed its
    instances `polls` times: the cloud moving on while a command waits. The CLI is
    sequential, so by the request numbered `polls` every earlier answer has been read."""
    start = len(fake.requests)

    def run():
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            with fake.lock:
                reqs = fake.requests[start:]
            patched = next((i for i, r in enumerate(reqs) if r["method"] == "PATCH"
                            and "/instanceGroupManagers/" in r["path"]), None)
            if patched is not None and sum(
                    "/listManagedInstances" in r["path"] for r in reqs[patched:]) >= polls:
                then()
                return
            time.sleep(0.02)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_cli_quota_check_names_the_quota_a_fallback_type_draws_on(fake, home, tmp_path,
                                                                 monkeypatch):
    # a3-megagpu-8g draws on NVIDIA_H100_MEGA_GPUS, not on the primary's NVIDIA_H100_GPUS:
    # the pool's peak on it alone is (6 max + 3 surge) x 8 = 72 GPUs; the region grants 16,
    # none in use: short by 56. Only information: the primary's quotas are enough here.
    path = tmp_path / "poolctl.yaml"
    path.write_text(pool_yaml(warm=0, extra_gcp="      fallback_machine_types: [a3-megagpu-8g]\n"))
    cfg = parse_config(path.read_text())
    deploy(fake, cfg, cfg.pools[0], stopped=0)
    fake.add_region(PROJECT, REGION, ZONES, quotas={
        "NVIDIA_H100_GPUS": (80, 8), "CPUS": (2000, 308), "LOCAL_SSD_TOTAL_GB": (60000, 6000),
        "NVIDIA_H100_MEGA_GPUS": (16, 0)})
    fake.set_project_quota(PROJECT, "GPUS_ALL_REGIONS", 80, 8)
    r = cli(fake, home, "quota", "check", "--cloud", "gcp", "--json", "-f", str(path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True
    (mega,) = [q for q in data["quotas"] if q["fallback"]]
    assert {k: mega[k] for k in ("name", "fallback", "scope", "needed", "granted", "in_use",
                                 "shortfall", "ok")} == {
        "name": "NVIDIA_H100_MEGA_GPUS", "fallback": "a3-megagpu-8g", "scope": REGION,
        "needed": 72, "granted": 16.0, "in_use": 0.0, "shortfall": 56.0, "ok": False}
    assert all(q["ok"] for q in data["quotas"] if not q["fallback"])
    (line,) = [ln for ln in r.stderr.splitlines() if "fallback a3-megagpu-8g" in ln]
    assert "quota NVIDIA_H100_MEGA_GPUS in us-central1: short by 56 GPU of the 72" in line
    # The table says which type the line is for (wide enough to show whole cells).
    monkeypatch.setenv("COLUMNS", "200")
    r = cli(fake, home, "quota", "check", "--cloud", "gcp", "-f", str(path))
    assert r.returncode == 0 and "(fallback a3-megagpu-8g)" in r.stdout


def test_cli_quota_check(fake, home, cfg_file, cfg, pool):
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    r = cli(fake, home, "quota", "check", "--cloud", "gcp", "--json", "-f", str(cfg_file))
    assert r.returncode == 1, r.stderr  # H100 and GPUS_ALL_REGIONS are short
    data = json.loads(r.stdout)
    assert data["ok"] is False
    q = {x["name"]: x for x in data["quotas"]}
    assert list(q) == ["NVIDIA_H100_GPUS", "CPUS", "LOCAL_SSD_TOTAL_GB", "GPUS_ALL_REGIONS"]
    # (6 max + 3 surge) x 8 GPUs = 72; 1 running node holds 8 of the 8 in use.
    assert {k: q["NVIDIA_H100_GPUS"][k] for k in (
        "pool", "cloud", "scope", "unit", "needed", "granted", "in_use", "pool_in_use",
        "available", "shortfall", "ok")} == {
        "pool": "chat-70b", "cloud": "gcp", "scope": REGION, "unit": "GPU", "needed": 72,
        "granted": 16.0, "in_use": 8.0, "pool_in_use": 8.0, "available": 8.0,
        "shortfall": 56.0, "ok": False}
    # 9 x 208 = 1,872 vCPUs beside 100 of others: 2,000 is enough.
    assert (q["CPUS"]["needed"], q["CPUS"]["shortfall"], q["CPUS"]["ok"]) == (1872, 0, True)
    assert (q["LOCAL_SSD_TOTAL_GB"]["needed"], q["LOCAL_SSD_TOTAL_GB"]["ok"]) == (54000, True)
    assert (q["GPUS_ALL_REGIONS"]["scope"], q["GPUS_ALL_REGIONS"]["needed"],
            q["GPUS_ALL_REGIONS"]["shortfall"]) == ("global", 72, 8.0)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr
    assert "quota NVIDIA_H100_GPUS in us-central1: short by 56 GPU" in err[0]


def test_cli_quota_request_files_once(fake, home, cfg_file, cfg, pool, monkeypatch):
    monkeypatch.setenv("POOLCTL_QUOTA_CONTACT_EMAIL", "gpu-team@example.com")
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    args = ("quota", "request", "--cloud", "gcp", "--auto-approve", "--json",
            "-f", str(cfg_file))
    r = cli(fake, home, *args)
    assert r.returncode == 0, r.stderr
    reqs = {x["name"]: x for x in json.loads(r.stdout)["requests"]}
    # granted + shortfall: 16 + 56 = 72 H100; 64 + 8 = 72 across regions.
    assert (reqs["NVIDIA_H100_GPUS"]["desired"], reqs["NVIDIA_H100_GPUS"]["state"],
            reqs["NVIDIA_H100_GPUS"]["already_open"]) == (72, "PENDING", False)
    assert reqs["GPUS_ALL_REGIONS"]["desired"] == 72
    assert set(reqs) == {"NVIDIA_H100_GPUS", "GPUS_ALL_REGIONS"}
    again = cli(fake, home, *args)
    assert again.returncode == 0, again.stderr
    assert all(x["already_open"] for x in json.loads(again.stdout)["requests"])
    assert len(fake.preferences) == 2


def test_cli_quota_request_contact_email_flag(fake, home, cfg_file, cfg, pool, monkeypatch):
    monkeypatch.delenv("POOLCTL_QUOTA_CONTACT_EMAIL", raising=False)
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    args = ("quota", "request", "--cloud", "gcp", "--auto-approve", "--json",
            "-f", str(cfg_file))
    # Cloud Quotas requires a contact: without one, nothing is filed (exit 2, one line).
    r = cli(fake, home, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert fake.preferences == {}
    assert "--contact-email: Cloud Quotas requires a contact email" in r.stderr.splitlines()[-1]
    r = cli(fake, home, *args, "--contact-email", "not-an-address")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(
        "poolctl: --contact-email 'not-an-address': not an email address")
    r = cli(fake, home, *args, "--contact-email", "gpu-team@example.com")
    assert r.returncode == 0, r.stderr
    creates = _calls(fake, "POST", "/quotaPreferences")
    # H100 and GPUS_ALL_REGIONS were short; the address is input only (never read back).
    assert len(creates) == len(fake.preferences) == 2
    assert {c["body"]["contactEmail"] for c in creates} == {"gpu-team@example.com"}


def test_cli_warm_rounds_up_and_waits(fake, home, cfg_file, cfg, pool):
    deploy(fake, cfg, pool)
    _seed_quotas(fake)
    # The third standby VM is created, then stops once the wait has seen it pending.
    t = after_patch_polls(fake, 2, fake.settle)
    r = cli(fake, home, "warm", "--replicas", "10", "--cloud", "gcp", "--wait", "--json",
            "--timeout", "30", "-f", str(cfg_file))
    t.join(5)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # 10 replicas at 4 per node -> 3 nodes = 12 replicas, said so.
    assert {k: d[k] for k in ("pool", "cloud", "mode", "replicas_requested",
                              "replicas_per_node", "nodes", "replicas", "rounded_up",
                              "changed")} == {
        "pool": "chat-70b", "cloud": "gcp", "mode": "warm", "replicas_requested": 10,
        "replicas_per_node": 4, "nodes": 3, "replicas": 12, "rounded_up": True,
        "changed": True}
    assert d["before"] == {"min_nodes": 1, "warm_nodes": 2, "desired_nodes": 1}
    assert d["after"] == {"min_nodes": 1, "warm_nodes": 3, "desired_nodes": 1}
    assert "10 replicas rounded up to 3 whole node(s) of 4 replicas = 12 replicas" in r.stderr
    # Quota for what runs at once: 1 serving + 1 standby VM during its first boot = 2 nodes
    # = 16 H100, of which the pool's running node already holds 8: 16 + 8 - 8 - 16 = 0.
    h100 = next(x for x in d["quota"] if x["name"] == "NVIDIA_H100_GPUS")
    assert (h100["needed"], h100["shortfall"]) == (16, 0)
    assert (d["wait"]["ready"], d["wait"]["target"]) == (3, 3)
    assert len(d["wait"]["nodes"]) == 1  # the new one; the 2 already warm are not timed
    assert fake.migs[(PROJECT, REGION, MIG)]["targetStoppedSize"] == 3

    # Absolute: asking again changes nothing and says so.
    r = cli(fake, home, "warm", "--replicas", "9", "--cloud", "gcp", "--json",
            "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["changed"] is False
    assert "nothing changed" in r.stderr


def test_cli_status(fake, home, cfg_file, cfg, pool):
    deploy(fake, cfg, pool)
    vm = fake.instances(PROJECT, REGION, MIG)[0]["name"]
    fake.set_health(vm, "UNHEALTHY")
    fake.write_point(PROJECT, vm, 2.5, _minute_ago() + timedelta(seconds=30))
    r = cli(fake, home, "status", "--cloud", "gcp", "--json", "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)["pools"]
    assert (s["pool"], s["cloud"], s["replicas_per_node"]) == ("chat-70b", "gcp", 4)
    assert s["nodes"] == {"in_service": 0, "warm": 2, "pending": 0, "unhealthy": 1,
                          "terminating": 0}
    assert s["replicas"] == {"in_service": 0, "warm": 8, "pending": 0, "unhealthy": 4,
                             "terminating": 0}
    assert {k: s["group"][k] for k in ("name", "region", "min_nodes", "max_nodes",
                                       "desired_nodes", "warm_min_nodes", "warm_state",
                                       "version")} == {
        "name": MIG, "region": REGION, "min_nodes": 1, "max_nodes": 6, "desired_nodes": 1,
        "warm_min_nodes": 2, "warm_state": "stopped", "version": V1}
    # The queue, under the key AWS fills: the one VM's point of the newest minute.
    assert s["rollout"] is None and s["queue_per_replica"] == 2.5
    assert len(s["instances"]) == 3
    r = cli(fake, home, "status", "--cloud", "gcp", "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    assert "queue: 2.5 waiting per replica" in r.stdout


def test_cli_rollout_status_cancel_rollback(fake, home, cfg_file, cfg, pool, monkeypatch):
    from poolctl import runtime

    ops = GcpOps(client_options={"api_endpoint": fake.endpoint},
                 credentials=AnonymousCredentials())
    g = _canary_pool(fake, ops, cfg)
    # What `rollout start` leaves (its apply needs Terraform, not faked here): the canary at
    # 25 %, its one VM up and healthy, and the record.
    ops.rollout_begin(g, cfg, pool, plan_pool(pool, "gcp"), no_surge=False, stack_dir=None)
    fake.step_rollout(PROJECT, REGION, MIG, 1)
    cfg_file.write_text(pool_yaml().replace("v0.11.0", "v0.12.0"))
    monkeypatch.setenv("POOLCTL_HOME", str(home))
    runtime.save_record(cfg, pool, "gcp", runtime.RolloutRecord(
        stack="acme-chat-70b-gcp", pool="chat-70b", cloud=Cloud.gcp, file=str(cfg_file),
        key="serving.image", from_value="vllm/vllm-openai:v0.11.0",
        to_value="vllm/vllm-openai:v0.12.0", line=16, group_version_from=V1,
        group_version_to=V2, status="started", rollout_id=V2,
        started_at="2026-02-01T09:00:00+00:00"), new=True)

    r = cli(fake, home, "rollout", "status", "--cloud", "gcp", "--json", "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ro = d["rollout"]
    assert (d["pool"], d["cloud"], d["group"], d["group_version"]) == (
        "chat-70b", "gcp", MIG, V2)
    # 1 of 6 VMs on V2: the 25 % canary (1 of the 4 serving VMs), healthy: step reached.
    assert (ro["id"], ro["status"], ro["done"], ro["step"], ro["checkpoint_reached"],
            ro["percentage_complete"], ro["instances_to_update"]) == (
        V2, "in_progress", False, 25, 25, 16.7, 0)
    assert ro["checkpoints"] == [25, 50, 100]
    assert ro["reason"] == "canary 25%: 1 of 1 node(s) healthy"
    assert ro["from_version"] == f"serving.image=vllm/vllm-openai:v0.11.0 ({V1})"
    assert ro["to_version"] == f"serving.image=vllm/vllm-openai:v0.12.0 ({V2})"
    # Per version: the 3 serving VMs left on V1 healthy, its 2 standby VMs stopped.
    assert ro["versions"] == [asdict(_row("stable", V1, None, 5, 3)),
                              asdict(_row("canary", V2, 1, 1, 1))]
    assert d["checkpoints"] == [{"percentage": 25, "reached": True},
                                {"percentage": 50, "reached": False},
                                {"percentage": 100, "reached": False}]
    assert not any(w in r.stdout + r.stderr for w in ("InstanceRefresh", "instance refresh"))
    r = cli(fake, home, "rollout", "status", "--cloud", "gcp", "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())  # rich wraps at the terminal's width
    assert "in progress 16.7%, checkpoint 25% reached, 0 to update" in out
    assert "step: 25%" in out
    assert f"canary {V2}: 1 node(s) of 1 wanted, 1 healthy, 0 unhealthy, 0 pending" in out

    # Cancel holds the split: 1 VM on V2, the rest on V1, nothing moves.
    r = cli(fake, home, "rollout", "cancel", "--cloud", "gcp", "--json", "-f", str(cfg_file))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["rollout"]["status"], d["rollout"]["done"], d["rollout"]["step"]) == (
        "cancelled", True, 25)
    assert _versions(fake) == [{"name": "stable", "template": V1}, {
        "name": "canary-held", "template": V2, "targetSize": {"percent": 25}}]

    # Rollback from the held split: the MIG goes back to V1 and the file to v0.11.0; the
    # command watches until the VM on V2 is replaced back.
    t = after_patch_polls(fake, 2, lambda: fake.step_rollout(PROJECT, REGION, MIG, 6))
    r = cli(fake, home, "rollout", "rollback", "--cloud", "gcp", "--auto-approve", "--json",
            "--timeout", "30", "-f", str(cfg_file))
    t.join(5)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["how"], d["key"], d["from"], d["to"]) == (
        "cloud_rollback", "serving.image", "vllm/vllm-openai:v0.12.0",
        "vllm/vllm-openai:v0.11.0")
    assert (d["rollout"]["id"], d["rollout"]["status"], d["rollout"]["instances_to_update"]) \
        == (V2, "rolling_back", 1)
    assert (d["final"]["status"], d["final"]["done"], d["final"]["percentage_complete"]) == (
        "rolled_back", True, 100.0)
    assert "image: vllm/vllm-openai:v0.11.0" in cfg_file.read_text()
    assert _versions(fake) == [{"name": "rollback", "template": V1}]


def test_cli_gcp_errors_are_one_line(fake, home, cfg_file):
    fake.add_region(PROJECT, REGION, ZONES)
    r = cli(fake, home, "status", "--cloud", "gcp", "-f", str(cfg_file))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "no regional MIG in project acme-prod, region us-central1" in r.stderr
    r = cli(fake, home, "warm", "--replicas", "4", "--cloud", "gcp", "--sandbox",
            "-f", str(cfg_file))
    assert r.returncode == 2 and "--sandbox" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_endpoint_is_one_line(cfg, pool):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ops = GcpOps(client_options={"api_endpoint": f"http://127.0.0.1:{port}"},
                 retry_initial_s=0.01, retry_deadline_s=0.3)
    with pytest.raises(OperationFailed) as e:
        ops.find_group(cfg, pool)
    assert str(e.value).startswith("GCP list instance templates: still failing after retries")
    assert "\n" not in str(e.value)


def test_destroy_deletes_the_kept_templates(fake, ops, cfg, pool):
    """After `destroy`, the previous templates a rollout kept out of Terraform's state (its
    rollback targets) go too; templates of other pools stay."""
    deploy(fake, cfg, pool, older_templates=("acme-chat-70b-old1", "acme-chat-70b-old2"))
    fake.add_template(PROJECT, "other-team", labels={"team": "other"})
    # Terraform destroyed the MIG and its current template; the kept ones remain.
    with fake.lock:
        fake.migs.clear()
        fake.managed.clear()
    fake.delete_template(PROJECT, "acme-chat-70b-20260105090000000000000001")

    done = ops.delete_pool_templates(cfg, pool)

    assert sorted(done.deleted) == ["acme-chat-70b-old1", "acme-chat-70b-old2"]
    assert done.failed == []
    assert sorted(n for (_, n) in fake.templates) == ["other-team"]
    assert _calls(fake, "DELETE", "/global/instanceTemplates/acme-chat-70b-old1")


# ---------------------------------------------------------------- what the engines served


def _agent(cfg, pool):
    """The node agent's gcp_metrics as the GCP boot script renders it: (scrape text, queue,
    start, end, instance id, zone) -> the timeSeries.create body it writes."""
    import subprocess

    from poolctl.bootscript import render_boot_script
    text = render_boot_script(cfg, pool, Cloud.gcp)
    a = text.index("gcp_metrics() {\n")
    b = text.index("\n}\n", text.index("}' \"$1\"", a)) + 3
    fn = text[a:b]

    def run(scrape: str, queue: float, start: datetime, end: datetime, vm: str, zone: str
            ) -> dict:
        res = json.dumps({"type": "gce_instance", "labels": {
            "project_id": PROJECT, "instance_id": vm, "zone": zone}})
        r = subprocess.run(
            ["bash", "-c", 'source /dev/stdin <<<"$0"; gcp_metrics /dev/fd/3 "$@" 3<<<"$5"', fn,
             f"{queue:.3f}", _stamp_ms(start), _stamp_ms(end), res, scrape],
            env={"MIG": MIG, "METRIC_TYPE": naming.GCP_METRIC_TYPE, "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    return run


def _stamp_ms(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _scrape(cum: tuple[int, ...], total_s: float, requests: int, tokens: int, running: int,
            kv: float) -> str:
    ttft = "vllm:time_to_first_token_seconds"
    lines = [f'{ttft}_bucket{{engine="0",le="{le}",model_name="m"}} {c}.0'
             for le, c in zip(("0.1", "0.25", "0.5", "+Inf"), cum, strict=True)]
    return "\n".join([
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        *lines, f'{ttft}_count{{engine="0",model_name="m"}} {cum[-1]}.0',
        f'{ttft}_sum{{engine="0",model_name="m"}} {total_s}',
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {requests}.0',
        f'vllm:generation_tokens_total{{engine="0"}} {tokens}.0',
        f'vllm:num_requests_running{{engine="0"}} {running}.0',
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}']) + "\n"


def test_what_the_node_agent_writes_status_reads_back(fake, ops, cfg, pool):
    # Two nodes write their cumulative series (the rendered agent's bodies, POSTed to
    # timeSeries.create over HTTP); status reads the last 10 minutes back.
    import requests

    deploy(fake, cfg, pool, running=2, stopped=0)
    (a, za), (b, zb) = [(str(mi["id"]), mi["instance"].split("/zones/")[1].split("/")[0])
                        for mi in fake.instances(PROJECT, REGION, MIG)]
    run = _agent(cfg, pool)
    now = datetime.now(UTC)

    def ago(minutes: float) -> datetime:
        return now - timedelta(minutes=minutes)

    writes = [  # (vm, zone, engine start, at, TTFT cumulative buckets, sum, requests,
                #  generation tokens, running, KV, queue per replica)
        (a, za, ago(30), ago(15), (1, 1, 1, 1), 0.05, 50, 1000, 1, 0.2, 9.0),  # the baseline
        (b, zb, ago(30), ago(15), (0, 0, 0, 0), 0.0, 0, 0, 0, 0.4, 9.0),
        (a, za, ago(30), ago(5), (1, 2, 3, 3), 0.8, 52, 1400, 3, 0.2, 1.0),
        (b, zb, ago(30), ago(6), (0, 1, 3, 3), 1.0, 4, 300, 2, 0.4, 2.0),
        (b, zb, ago(3), ago(1), (0, 0, 2, 2), 0.7, 2, 100, 4, 0.4, 3.0),  # restarted -3 min
        (a, za, ago(30), ago(1), (1, 2, 6, 6), 1.5, 55, 1800, 5, 0.2, 6.0),
    ]
    for vm, zone, start, at, cum, total, req, tok, running, kv, queue in writes:
        body = run(_scrape(cum, total, req, tok, running, kv), queue, start, at, vm, zone)
        r = requests.post(f"{fake.endpoint}/v3/projects/{PROJECT}/timeSeries", json=body,
                          timeout=10)
        assert r.status_code == 200, r.text
    types = {ts["metric"]["type"] for ts in body["timeSeries"]}
    assert types == {naming.GCP_METRIC_TYPE, naming.GCP_TTFT_TYPE, naming.GCP_REQUESTS_TYPE,
                     naming.GCP_PROMPT_TOKENS_TYPE, naming.GCP_OUTPUT_TOKENS_TYPE,
                     naming.GCP_RUNNING_TYPE, naming.GCP_KV_USAGE_TYPE}

    w = ops.serving_window(ops.find_group(cfg, pool), 600, 0.31, 0.05)
    assert w is not None
    # By hand. In the window: a's increase since its -15 min point, (0, 1, 5, 5) sum 1.45;
    # b's first engine since -15 min, (0, 1, 3, 3) sum 1.0; its restarted one from 0,
    # (0, 0, 2, 2) sum 0.7. Together: 2 in (0.1, 0.25], 8 in (0.25, 0.5], 3.15 s.
    # Read as the agent spreads it on AWS: the 8 narrowed around their mean (3.15 - 2 x
    # 0.175) / 8 = 0.35, below the middle: [0.25, 0.45], 10 points 0.02 apart from 0.26,
    # 0.8 each; the 2 over 10 points of (0.1, 0.25], 0.2 each. p90 needs 9: 2 + 0.8 n >= 9
    # at n = 9, 0.42; p50 needs 5: n = 4, 0.32. Within 0.31 s: 2 + 3 x 0.8 = 4.4 of 10.
    assert w.ttft_p90_s == pytest.approx(0.42)
    assert w.ttft_p50_s == pytest.approx(0.32)
    assert w.ttft_mean_s == pytest.approx(0.315)
    assert w.ttft_within == pytest.approx(0.44)
    assert w.tpot_p90_s is None and w.tpot_mean_s is None  # no TPOT histogram published
    # Counters: a 55 - 50, b 4 - 0 and 2 since its restart: 11 requests; tokens 800 + 300
    # + 100. Gauges, each node's mean over its points in the window, then their mean:
    # running (3 + 5) / 2 and (2 + 4) / 2: 3.5; KV (0.2 + 0.4) / 2.
    assert (w.requests, w.output_tokens, w.prompt_tokens) == (11, 1200, 0)
    assert w.running == pytest.approx(3.5) and w.kv_usage == pytest.approx(0.3)
    # The queue (no pool label: the MIG's VMs' series), its points in the window: the
    # mean of 1, 2, 3 and 6 (the two at -15 min are outside): 3.
    assert w.queue_per_replica == pytest.approx(3.0)
    calls = _calls(fake, "GET", "/timeSeries")
    assert len(calls) == 8 and sum(
        f'metric.labels.pool = "{MIG}"' in c["query"]["filter"] for c in calls) == 7


def test_monitoring_refuses_what_cloud_monitoring_refuses(fake, cfg, pool):
    # The fake's timeSeries.create checks what the agent relies on: points in order, a
    # CUMULATIVE start before its end, a distribution's count its buckets' sum.
    import requests

    deploy(fake, cfg, pool, running=1, stopped=0)
    (mi,) = fake.instances(PROJECT, REGION, MIG)
    vm, zone = str(mi["id"]), mi["instance"].split("/zones/")[1].split("/")[0]
    run = _agent(cfg, pool)
    now = datetime.now(UTC)
    url = f"{fake.endpoint}/v3/projects/{PROJECT}/timeSeries"
    scrape = _scrape((1, 2, 3, 3), 0.9, 3, 30, 1, 0.1)
    ok = run(scrape, 0.0, now - timedelta(minutes=5), now - timedelta(minutes=1), vm, zone)
    assert requests.post(url, json=ok, timeout=10).status_code == 200
    again = requests.post(url, json=ok, timeout=10)  # the same end time: out of order
    assert again.status_code == 400 and "written in order" in again.text
    late = run(scrape, 0.0, now - timedelta(minutes=5), now - timedelta(minutes=6), vm, zone)
    assert requests.post(url, json=late, timeout=10).status_code == 400
    bad = json.loads(json.dumps(ok))
    for ts in bad["timeSeries"]:
        if ts["valueType"] == "DISTRIBUTION":
            ts["points"][0]["value"]["distributionValue"]["count"] = "99"
            ts["points"][0]["interval"]["endTime"] = _stamp_ms(now)
    r = requests.post(url, json={"timeSeries": [ts for ts in bad["timeSeries"]
                                                if ts["valueType"] == "DISTRIBUTION"]},
                      timeout=10)
    assert r.status_code == 400 and "sum of bucket_counts" in r.text


def test_the_phase_ledger_reads_each_vms_serial_port(fake, ops, cfg, pool, tmp_path,
                                                     monkeypatch):
    # Two VMs: one booted cold and serves, one failed in its weights phase. Their boot
    # scripts' lines on their serial ports (with the kernel's around them).
    from poolctl.runtime.ledger import pool_ledger

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    deploy(fake, cfg, pool, running=2, stopped=0)
    a, b = (mi["name"] for mi in fake.instances(PROJECT, REGION, MIG))
    fake.write_serial(a, "[    0.0] Linux version 6.8\n"
                         "poolctl: boot: acme-chat-70b serving m version 1, uptime 41.2s\n"
                         "poolctl: phase=gpus seconds=2\npoolctl: phase=nvme seconds=3\n"
                         "poolctl: phase=weights seconds=50\npoolctl: phase=image seconds=95\n"
                         "poolctl: phase=serving seconds=88\n"
                         "poolctl: phase=readiness seconds=31\n"
                         "poolctl: phase=total seconds=267 uptime=308.4\n")
    fake.write_serial(b, "poolctl: boot: acme-chat-70b serving m version 1, uptime 40s\n"
                         "poolctl: FAILED: weights: gcloud storage cp failed\n"
                         "poolctl: phase=failed seconds=20 in=weights\n")
    lg = pool_ledger(cfg, pool, Cloud.gcp, ops)
    assert lg is not None
    rows = {n.node.id: n for n in lg.nodes}
    ok, bad = rows[a].last, rows[b].last
    assert ok is not None and bad is not None
    assert (ok.kind, ok.boot_s, ok.uptime_s) == ("cold", 41.2, 308.4)
    assert ok.phases == {"gpus": 2, "nvme": 3, "weights": 50, "image": 95, "serving": 88,
                         "readiness": 31}
    assert (bad.failed_in, bad.failure, bad.served) == (
        "weights", "weights: gcloud storage cp failed", False)
    assert {k: (v.n, v.p50_s) for k, v in lg.starts.items()} == {"cold": (1, 308.4)}
    assert len(_calls(fake, "GET", "/serialPort")) == 2


def test_warm_suggest_reads_the_running_requests_history_of_the_mig(fake, ops, cfg, pool):
    """`warm --suggest` on GCP (no forecast of custom metrics there): two days of the nodes'
    running requests, hourly, from Cloud Monitoring (each VM's hourly mean, summed). By hand:
    each of 2 VMs runs 48 for the 12 hours from 06:00 UTC (96 in flight: 4 nodes at 6 per
    replica x 4 replicas of TP 2 per a3-highgpu-8g node), else 12 (24: 1 node, the
    minimum). One window: 06:00-18:00 UTC, +3 nodes (12 replicas), starting the plan's cold
    start ahead of 06:00."""
    import requests

    from poolctl.runtime.suggest import suggest

    deploy(fake, cfg, pool, running=2, stopped=0)
    vms = [(str(mi["id"]), mi["instance"].split("/zones/")[1].split("/")[0])
           for mi in fake.instances(PROJECT, REGION, MIG)]
    this_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    url = f"{fake.endpoint}/v3/projects/{PROJECT}/timeSeries"
    for k in range(48, 0, -1):  # in time order, as Cloud Monitoring requires
        at = this_hour - timedelta(hours=k) + timedelta(minutes=30)
        value = 48.0 if 6 <= at.hour < 18 else 12.0
        body = {"timeSeries": [{
            "metric": {"type": naming.GCP_RUNNING_TYPE,
                       "labels": {naming.GCP_POOL_LABEL: MIG}},
            "resource": {"type": "gce_instance", "labels": {
                "project_id": PROJECT, "instance_id": vm, "zone": zone}},
            "metricKind": "GAUGE", "valueType": "DOUBLE",
            "points": [{"interval": {"endTime": at.isoformat().replace("+00:00", "Z")},
                        "value": {"doubleValue": value}}]} for vm, zone in vms]}
        r = requests.post(url, json=body, timeout=10)
        assert r.status_code == 200, r.text
    target = pool.model_copy(update={"scaling": pool.scaling.model_copy(
        update={"predictive_target": 6.0})})
    now = this_hour + timedelta(minutes=1)
    got = suggest(cfg, target, Cloud.gcp, ops, days=2, now=now)
    assert (got.hours, got.per_node, got.min_nodes) == (48, 24.0, 1)
    [s] = got.suggestions
    assert (s.hours_utc, s.nodes, s.replicas, s.peak_in_flight) == (
        tuple(range(6, 18)), 3, 12, 96.0)
    lead = sum(plan_pool(pool, Cloud.gcp).start_phases["cold"].values())
    assert got.lead_s == pytest.approx(lead, abs=0.5)
    six = now.replace(hour=6, minute=0)
    if six - timedelta(seconds=lead) < now:
        six += timedelta(days=1)
    assert s.start == six - timedelta(seconds=got.lead_s)
    assert s.end == six + timedelta(hours=12)
    [call] = _calls(fake, "GET", "/timeSeries")[-1:]
    assert call["query"]["aggregation.perSeriesAligner"] == "ALIGN_MEAN"
    assert call["query"]["aggregation.crossSeriesReducer"] == "REDUCE_SUM"
