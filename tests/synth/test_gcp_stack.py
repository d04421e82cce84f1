"""The GCP pool stack: assertions on the synthesized JSON, a golden file per example stack,
checkov with named skips, and `terraform validate` with the real CLI where present.

One synth per module covers both examples and a variant (running warm pool, GCS state,
Shared VPC, no surge). Regenerate the golden files with `POOLCTL_UPDATE_GOLDEN=1 pytest
tests/synth`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config, parse_config
from poolctl.errors import UsageError
from tests.plugins.golden import assert_golden
from tests.synth.util import (
    provider_modules_after_synth,
    run_checkov,
    synth_without_and_with_record,
    terraform_validate,
)

pytestmark = pytest.mark.synth

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "synth"
GCP_EXAMPLES = {
    "acme-chat-70b-gcp": ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml",
    "acme-mistral-24b-gcp": ROOT / "examples" / "mistral-gcp" / "poolctl.yaml",
}
LABELS_70B = {"poolctl-project": "acme", "poolctl-pool": "chat-70b", "poolctl-role": "inference"}
HEALTH_RANGES = ["35.191.0.0/16", "130.211.0.0/22"]

# Every GCP check of the current checkov passes; the repository's .checkov.yaml skips only
# AWS checks.

VARIANT = """
project: beta
backend:
  gcp: {bucket: beta-tfstate, prefix: pools}
pools:
  - name: small
    model: {id: Qwen/Qwen2.5-7B-Instruct, params_b: 7.6, dtype: bfloat16, layers: 28,
            kv_heads: 4, head_dim: 128}
    serving: {image: "us-docker.pkg.dev/beta/serving/vllm:v1", tensor_parallel: 1,
              max_model_len: 8192, port: 9000, health_path: /ready, balancer: sticky}
    scaling: {min_replicas: 8, max_replicas: 16}
    warm_pool: {replicas: 8, state: running}
    rollout: {max_surge_replicas: 0}
    slo: {ttft_p90_s: 1.5, tpot_p90_s: 0.05, alarm_after_s: 600}
    gcp:
      project: beta-svc
      alert_notification_channel: projects/beta-svc/notificationChannels/8675309
      region: us-east4
      machine_type: a3-highgpu-8g
      zones: [us-east4-a, us-east4-b]
      weights_uri: gs://beta-weights
      network: projects/beta-host/global/networks/shared
      subnetwork: projects/beta-host/regions/us-east4/subnetworks/gpu
      certificate: beta-tls
      capacity: {reservations: [a3-reserved-a, a3-reserved-b], reserved_nodes: 2}
  - name: flex
    model: {id: Qwen/Qwen2.5-7B-Instruct, params_b: 7.6, dtype: bfloat16, layers: 28,
            kv_heads: 4, head_dim: 128}
    serving: {image: "us-docker.pkg.dev/beta/serving/vllm:v1", tensor_parallel: 1,
              max_model_len: 8192}
    scaling: {min_replicas: 8, max_replicas: 16}
    warm_pool: {replicas: 0}
    gcp:
      project: beta-svc
      region: us-central1
      machine_type: a3-highgpu-8g
      fallback_machine_types: [a3-megagpu-8g, a3-edgegpu-8g]
      weights_uri: gs://beta-weights
      compile_cache_uri: gs://beta-cache/compile/
      certificate: beta-tls
"""


def _synth(configs, outdir):
    from poolctl_stacks.app import synth

    return synth(configs, outdir)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("synth-gcp")
    configs = []
    for path in GCP_EXAMPLES.values():
        cfg = load_config(path)
        configs.append((cfg, cfg.targets(None, Cloud.gcp)))
    variant = parse_config(VARIANT)
    configs.append((variant, variant.targets(None, Cloud.gcp)))
    dirs = _synth(configs, out)
    return {d.name: {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text()),
                     "text": (d / "cdk.tf.json").read_text()}
            for d in dirs}


def resources(doc: dict, rtype: str) -> list[dict]:
    return list(doc["resource"].get(rtype, {}).values())


def one(doc: dict, rtype: str) -> dict:
    found = resources(doc, rtype)
    assert len(found) == 1, f"expected one {rtype}, found {len(found)}"
    return found[0]


def doc_of(stacks, name: str) -> dict:
    return stacks[name]["json"]


def resolved(doc: dict, value, env: dict[str, int] | None = None):
    """A number the stack takes from its variables, as Terraform resolves it: `var.NAME` is
    env[NAME] when given (a runtime command's TF_VAR_NAME), else the default (`deploy`).
    The stack's expressions are a variable or a sum of two."""
    m = re.fullmatch(r"\$\{\(?([\w. +]+?)\)?\}", str(value))
    if not m:
        return value
    total = 0
    for term in m.group(1).split("+"):
        name = term.strip().removeprefix("var.")
        total += (env or {}).get(name, doc["variable"][name]["default"])
    return total


def test_every_target_has_a_stack(stacks):
    assert set(stacks) == set(GCP_EXAMPLES) | {"beta-small-gcp", "beta-flex-gcp"}


def test_terraform_block_and_local_state(stacks):
    tf = doc_of(stacks, "acme-chat-70b-gcp")["terraform"]
    assert tf["required_providers"]["google"] == {
        "source": "hashicorp/google", "version": ">= 6.16.0, < 9.0.0"}
    assert "aws" not in tf["required_providers"]
    assert tf["backend"] == {"local": {"path": "terraform.tfstate"}}


def test_gcs_state_per_stack(stacks):
    tf = doc_of(stacks, "beta-small-gcp")["terraform"]
    assert tf["backend"] == {"gcs": {"bucket": "beta-tfstate", "prefix": "pools/beta-small-gcp"}}


def test_contract_labels(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    (prov,) = doc["provider"]["google"]
    # Hyphens, not the snake_case cdktf would make of a provider map.
    assert prov["default_labels"] == LABELS_70B
    assert (prov["project"], prov["region"]) == ("acme-prod", "us-central1")
    tpl = one(doc, "google_compute_instance_template")
    assert tpl["labels"] == LABELS_70B
    assert tpl["disk"][0]["labels"] == LABELS_70B
    assert one(doc, "google_compute_forwarding_rule")["labels"] == LABELS_70B


def test_template_is_locked_down(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    tpl = one(doc, "google_compute_instance_template")
    assert tpl["machine_type"] == "a3-highgpu-8g"
    assert tpl["name_prefix"] == "acme-chat-70b-"
    # A new name per content version, made before the old template goes; `rollout start`
    # keeps the old one (tests/ops/test_runtime_gcp.py: rollout_before_apply).
    assert tpl["lifecycle"]["create_before_destroy"] is True
    (nic,) = tpl["network_interface"]
    assert "access_config" not in nic and "ipv6_access_config" not in nic
    assert nic["nic_type"] == "GVNIC"
    assert nic["subnetwork"] == "projects/acme-prod/regions/us-central1/subnetworks/default"
    assert tpl["can_ip_forward"] is False
    assert tpl["shielded_instance_config"] == {
        "enable_secure_boot": True, "enable_vtpm": True, "enable_integrity_monitoring": True}
    assert tpl["scheduling"]["on_host_maintenance"] == "TERMINATE"
    assert tpl["scheduling"]["automatic_restart"] is True
    md = tpl["metadata"]
    assert md["enable-oslogin"] == "TRUE" and md["block-project-ssh-keys"] == "TRUE"
    assert md["serial-port-enable"] == "FALSE"
    assert tpl["service_account"]["scopes"] == ["cloud-platform"]
    assert tpl["service_account"]["email"].startswith("${google_service_account.")
    # GPUs come with the A3 machine type; no accelerator block, no extra (GPUDirect) NICs.
    assert "guest_accelerator" not in tpl
    assert "metadata_startup_script" not in tpl


_CHOICE = re.compile(r'^\$\{lookup\(data\.google_compute_image\.(?P<image_data>[\w-]+)\.labels, '
                     r'"poolctl-boot-library", ""\) == "(?P<version>gcp-[0-9a-f]{12})" \? '
                     r'(?P<image>"(?:[^"\\]|\\.)*") : (?P<whole>"(?:[^"\\]|\\.)*")\}$', re.S)


def boot_variants(startup_script: str) -> dict[str, str]:
    """The instance template's startup-script: a choice on the node image's boot-library
    label between the image variant and the whole script, each an HCL string (its escapes
    are JSON's) holding the template-escaped script."""
    m = _CHOICE.match(startup_script)
    assert m, startup_script[:300]
    return {"image": json.loads(m["image"]), "whole": json.loads(m["whole"]),
            "version": m["version"], "image_data": m["image_data"]}


def test_startup_script_is_the_rendered_boot_script(stacks):
    from poolctl.bootscript import boot_library, render_boot_script

    cfg = load_config(GCP_EXAMPLES["acme-chat-70b-gcp"])
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    tpl = one(doc, "google_compute_instance_template")
    # Escaped for Terraform's template parser (tests/synth/test_terraform_literals.py runs it
    # through Terraform and gets both rendered scripts back).
    variants = boot_variants(tpl["metadata"]["startup-script"])
    assert variants["version"] == boot_library("gcp")["version"]
    for kind in ("whole", "image"):
        rendered = render_boot_script(cfg, cfg.pools[0], "gcp", from_image=kind == "image")
        assert "${" in rendered  # bash expansions
        script = variants[kind]
        assert script == rendered.replace("${", "$${").replace("%{", "%%{")
        assert script.startswith("#!")
        assert "private_key" not in script and "AKIA" not in script
    assert "%{" in variants["whole"]  # curl's -w format
    # The data source reads the image the template boots (the example's family).
    assert doc["data"]["google_compute_image"][variants["image_data"]] | {"//": None} == {
        "family": "common-cu124-ubuntu-2204-nvidia-550",
        "project": "deeplearning-platform-release", "//": None}


def test_boot_script_variant_is_chosen_from_the_image_not_from_build_records(
        tmp_path, monkeypatch):
    """As on AWS: a build record for the placement's image changes nothing in the JSON."""
    image = "projects/acme-prod/global/images/acme-chat-70b-20261202-000000"
    without, with_record = synth_without_and_with_record(
        GCP_EXAMPLES["acme-chat-70b-gcp"], "gcp", image, tmp_path, monkeypatch)
    assert with_record == without
    doc = json.loads(without)
    tpl = one(doc, "google_compute_instance_template")
    variants = boot_variants(tpl["metadata"]["startup-script"])
    assert doc["data"]["google_compute_image"][variants["image_data"]] | {"//": None} == {
        "name": "acme-chat-70b-20261202-000000", "project": "acme-prod", "//": None}
    assert tpl["disk"][0]["source_image"] == image


@pytest.mark.parametrize(("ref", "args"), [
    ("projects/p-1/global/images/family/f-1", {"project": "p-1", "family": "f-1"}),
    ("projects/p-1/global/images/n-1", {"project": "p-1", "name": "n-1"}),
    ("https://www.googleapis.com/compute/v1/projects/p-1/global/images/n-1",
     {"project": "p-1", "name": "n-1"}),
    ("global/images/family/f-1", {"project": "mine", "family": "f-1"}),
    ("global/images/n-1", {"project": "mine", "name": "n-1"}),
    ("family/f-1", {"project": "mine", "family": "f-1"}),
    ("p-1/n-1", {"project": "p-1", "name": "n-1"}),
    ("n-1", {"project": "mine", "name": "n-1"}),
    ("a/b/c", {"project": "mine", "name": "a/b/c"}),  # no such image: the plan says so
])
def test_image_lookup_reads_every_source_image_form(ref, args):
    from poolctl_stacks.gcp.pool import image_lookup

    assert image_lookup(ref, "mine") == args


def test_local_ssd_and_boot_disk(stacks):
    # a3-highgpu-8g bundles 16 x 375 GB Local SSD (catalog); both examples run on it.
    for stack, count in (("acme-chat-70b-gcp", 16), ("acme-mistral-24b-gcp", 16)):
        disks = one(doc_of(stacks, stack), "google_compute_instance_template")["disk"]
        boot = [d for d in disks if d.get("boot")]
        scratch = [d for d in disks if d.get("type") == "SCRATCH"]
        assert len(boot) == 1 and len(scratch) == count and len(disks) == count + 1
        assert all(d["interface"] == "NVME" and d["disk_size_gb"] == 375 for d in scratch)
        assert boot[0]["disk_type"] == "pd-ssd" and boot[0]["disk_size_gb"] == 200
        assert boot[0]["source_image"].endswith("common-cu124-ubuntu-2204-nvidia-550")
        assert "disk_encryption_key" not in boot[0]  # Google-managed encryption at rest


def test_mig_sizes_standby_and_rollout(stacks):
    # chat-70b: TP 2 -> 4 replicas/node; min 4 -> 1 node; warm 8 stopped -> 2 standby nodes;
    # surge 4 replicas -> 1 node, raised to the 3 zones a regional MIG needs at least.
    # Cold start 120 boot + 120 image (12 GB at 0.1 GB/s) + 45.2 weights (141.2 GB at
    # 100 Gbit/s x 0.25) + 35.3 load (70.6 GB/GPU at 2 GB/s) + 90 engine + 30 register = 440.
    mig = one(doc_of(stacks, "acme-chat-70b-gcp"), "google_compute_region_instance_group_manager")
    assert mig["distribution_policy_zones"] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert mig["distribution_policy_target_shape"] == "BALANCED"
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    assert (mig["target_size"], resolved(doc, mig["target_stopped_size"])) == (1, 2)
    assert "target_suspended_size" not in mig
    assert mig["standby_policy"] == {"mode": "SCALE_OUT_POOL", "initial_delay_sec": 440}
    # Sizes are the runtime's, and so are the versions (a rollout's canary steps).
    assert mig["lifecycle"]["ignore_changes"] == ["target_size", "version"]
    assert mig["version"][0]["name"] == "primary"
    up = mig["update_policy"]
    assert (up["type"], up["minimal_action"]) == ("PROACTIVE", "REPLACE")
    assert (resolved(doc, up["max_surge_fixed"]),
            resolved(doc, up["max_unavailable_fixed"])) == (3, 0)
    assert up["instance_redistribution_type"] == "NONE"
    assert mig["auto_healing_policies"]["initial_delay_sec"] == 440
    assert mig["named_port"] == [{"name": "http", "port": 8000}]
    assert mig["wait_for_instances"] is False
    assert mig["version"][0]["instance_template"].endswith(".self_link_unique}")
    # mistral-24b on a3-highgpu-8g: 4 replicas/node, min 16 -> 4 nodes, warm 8 -> 2 standby
    # nodes, surge 4 replicas -> 1 node, raised to the 3 zones.
    doc = doc_of(stacks, "acme-mistral-24b-gcp")
    mig = one(doc, "google_compute_region_instance_group_manager")
    assert mig["distribution_policy_zones"] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert (mig["target_size"], resolved(doc, mig["target_stopped_size"])) == (4, 2)
    assert (resolved(doc, mig["update_policy"]["max_surge_fixed"]),
            resolved(doc, mig["update_policy"]["max_unavailable_fixed"])) == (3, 0)


def test_running_warm_nodes_serve_and_no_surge(stacks):
    # small: TP 1 -> 8 replicas/node; min 8 -> 1, max 16 -> 2, warm 8 running -> 1 node that
    # joins the serving set (GCP standby pools hold stopped VMs only). No surge: one node
    # per zone (2) may be down at a time.
    doc = doc_of(stacks, "beta-small-gcp")
    mig = one(doc, "google_compute_region_instance_group_manager")
    assert mig["target_size"] == 2
    assert "standby_policy" not in mig and "target_stopped_size" not in mig
    assert (resolved(doc, mig["update_policy"]["max_surge_fixed"]),
            resolved(doc, mig["update_policy"]["max_unavailable_fixed"])) == (0, 2)
    pol = one(doc, "google_compute_region_autoscaler")["autoscaling_policy"]
    assert (resolved(doc, pol["min_replicas"]), resolved(doc, pol["max_replicas"])) == (2, 3)
    # The running warm node is part of the minimum: min_nodes 1 + warm_nodes 1.
    assert pol["min_replicas"] == "${(var.min_nodes + var.warm_nodes)}"
    assert (doc["variable"]["min_nodes"]["default"],
            doc["variable"]["warm_nodes"]["default"]) == (1, 1)
    # `warm --running --replicas 16` (2 nodes more): the runtime reads min 1, warm 1 + 2,
    # and the apply of a rollout keeps 1 + 3 = 4 serving nodes at least.
    assert resolved(doc, pol["min_replicas"], {"min_nodes": 1, "warm_nodes": 3}) == 4


def test_shared_vpc_paths(stacks):
    doc = doc_of(stacks, "beta-small-gcp")
    tpl = one(doc, "google_compute_instance_template")
    assert tpl["project"] == "beta-svc"
    assert tpl["network_interface"][0]["subnetwork"] == (
        "projects/beta-host/regions/us-east4/subnetworks/gpu")
    # Firewall rules and the proxy-only lookup belong to the host project's VPC.
    for fw in resources(doc, "google_compute_firewall"):
        assert fw["project"] == "beta-host"
        assert fw["network"] == "projects/beta-host/global/networks/shared"
    (sub,) = doc["data"]["google_compute_subnetwork"].values()
    assert (sub["project"], sub["region"], sub["name"]) == ("beta-host", "us-east4", "gpu")
    (proxies,) = doc["data"]["google_compute_subnetworks"].values()
    assert proxies["project"] == "beta-host"


def test_firewall_admits_only_health_checks_and_lb_proxies(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    fws = resources(doc, "google_compute_firewall")
    ingress = [f for f in fws if f["direction"] == "INGRESS"]
    assert len(ingress) == 2
    for f in ingress:
        assert f["allow"] == [{"protocol": "tcp", "ports": ["8000"]}]
        assert f["target_tags"] == ["acme-chat-70b-node"]
        assert "0.0.0.0/0" not in json.dumps(f["source_ranges"])
        assert "source_tags" not in f
    by_name = {f["name"]: f for f in ingress}
    assert by_name["acme-chat-70b-allow-health-checks"]["source_ranges"] == HEALTH_RANGES
    proxies = by_name["acme-chat-70b-allow-lb-proxies"]
    (lookup_id,) = doc["data"]["google_compute_subnetworks"]
    assert proxies["source_ranges"].startswith(
        f"${{[for s in data.google_compute_subnetworks.{lookup_id}.subnetworks")
    assert 'if s.network_name == \\"default\\"' in json.dumps(proxies["source_ranges"])
    assert "REGIONAL_MANAGED_PROXY" in doc["data"]["google_compute_subnetworks"][lookup_id][
        "filter"]
    # An empty source list would mean "from anywhere": the rule refuses to exist without one.
    (pre,) = proxies["lifecycle"]["precondition"]
    assert pre["condition"].startswith("${length([for s in data.google_compute_subnetworks.")
    assert "--purpose REGIONAL_MANAGED_PROXY" in pre["error_message"]
    # The matching template's tag is what the rules target.
    assert one(doc, "google_compute_instance_template")["tags"] == ["acme-chat-70b-node"]
    egress = {f["name"]: f for f in fws if f["direction"] == "EGRESS"}
    assert egress["acme-chat-70b-allow-https-out"]["allow"] == [
        {"protocol": "tcp", "ports": ["443"]}]
    assert egress["acme-chat-70b-deny-other-out"]["deny"] == [{"protocol": "all"}]
    assert (egress["acme-chat-70b-deny-other-out"]["priority"]
            > egress["acme-chat-70b-allow-https-out"]["priority"])


def test_private_google_access_is_a_precondition(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    tpl = one(doc, "google_compute_instance_template")
    (pre,) = tpl["lifecycle"]["precondition"]
    (sub_id,) = doc["data"]["google_compute_subnetwork"]
    assert pre["condition"] == (
        f"${{data.google_compute_subnetwork.{sub_id}.private_ip_google_access}}")
    assert "--enable-private-ip-google-access" in pre["error_message"]


def test_autoscaler_on_queue_metric(stacks):
    # chat-70b: 1..6 nodes (4..24 replicas at 4 per node), target 4 waiting per replica.
    a = one(doc_of(stacks, "acme-chat-70b-gcp"), "google_compute_region_autoscaler")
    assert a["target"].endswith(".id}") and "instance_group_manager" in a["target"]
    pol = a["autoscaling_policy"]
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    assert (pol["min_replicas"], pol["max_replicas"]) == ("${var.min_nodes}", "${var.max_nodes}")
    assert (resolved(doc, pol["min_replicas"]), resolved(doc, pol["max_replicas"]),
            pol["mode"]) == (1, 6, "ON")
    assert pol["cooldown_period"] == 440
    (metric,) = pol["metric"]
    assert metric == {
        "name": "custom.googleapis.com/poolctl/requests_waiting_per_replica",
        "filter": 'resource.type = "gce_instance"', "type": "GAUGE", "target": 4}
    assert pol["scale_in_control"] == {
        "max_scaled_in_replicas": {"fixed": 1}, "time_window_sec": 900}
    assert "cpu_utilization" not in pol


def test_internal_load_balancer(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    bes = one(doc, "google_compute_region_backend_service")
    assert bes["load_balancing_scheme"] == "INTERNAL_MANAGED"
    assert bes["locality_lb_policy"] == "LEAST_REQUEST"
    assert bes["timeout_sec"] >= 600 and bes["port_name"] == "http"
    assert bes["backend"][0]["group"].endswith(".instance_group}")
    checks = {h["name"]: h for h in resources(doc, "google_compute_region_health_check")}
    lb_check = checks["acme-chat-70b-lb"]
    assert lb_check["http_health_check"] == {"port": 8000, "request_path": "/health"}
    assert any(c.startswith("${google_compute_region_health_check.") for c in bes["health_checks"])
    assert checks["acme-chat-70b-heal"]["unhealthy_threshold"] * checks[
        "acme-chat-70b-heal"]["check_interval_sec"] >= 300
    rule = one(doc, "google_compute_forwarding_rule")
    assert rule["load_balancing_scheme"] == "INTERNAL_MANAGED"
    assert rule["port_range"] == "80" and rule["allow_global_access"] is False
    assert rule["subnetwork"].endswith("/subnetworks/default")
    assert "ip_address" not in rule  # allocated from the subnet, never a public address
    assert one(doc, "google_compute_region_url_map")["default_service"].startswith(
        "${google_compute_region_backend_service.")
    assert one(doc, "google_compute_region_target_http_proxy")["url_map"].startswith(
        "${google_compute_region_url_map.")
    # The variant's port and health path reach the checks and the firewall.
    v = doc_of(stacks, "beta-small-gcp")
    assert {h["http_health_check"]["request_path"]
            for h in resources(v, "google_compute_region_health_check")} == {"/ready"}
    assert {f["allow"][0]["ports"][0] for f in resources(v, "google_compute_firewall")
            if f["direction"] == "INGRESS"} == {"9000"}
    assert bes["session_affinity"] == "NONE" and "affinity_cookie_ttl_sec" not in bes


def test_sticky_balancer_is_cookie_affinity_over_a_hash_policy(stacks):
    """serving.balancer: sticky: GENERATED_COOKIE affinity for a day, under RING_HASH (the
    provider's docs: affinity takes no effect under LEAST_REQUEST)."""
    bes = one(doc_of(stacks, "beta-small-gcp"), "google_compute_region_backend_service")
    assert (bes["session_affinity"], bes["locality_lb_policy"]) == ("GENERATED_COOKIE",
                                                                    "RING_HASH")
    assert bes["affinity_cookie_ttl_sec"] == 24 * 3600


def test_service_account_least_privilege(stacks):
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    sa = one(doc, "google_service_account")
    assert (sa["account_id"], sa["project"]) == ("acme-chat-70b", "acme-prod")
    bucket = one(doc, "google_storage_bucket_iam_member")
    assert (bucket["bucket"], bucket["role"]) == ("acme-models", "roles/storage.objectViewer")
    expr = bucket["condition"]["expression"]
    assert ('resource.name.startsWith("projects/_/buckets/acme-models/objects/llama-3.1-70b/")'
            in expr)
    assert '"storage.googleapis.com/objectListPrefix", "").startsWith("llama-3.1-70b/")' in expr
    roles = sorted(m["role"] for m in resources(doc, "google_project_iam_member"))
    assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    for m in resources(doc, "google_project_iam_member") + [bucket]:
        assert m["member"] == "serviceAccount:${google_service_account." + next(
            iter(doc["resource"]["google_service_account"])) + ".email}"
    # Nothing else grants anything.
    assert not [t for t in doc["resource"] if "iam" in t and t not in (
        "google_project_iam_member", "google_storage_bucket_iam_member")]
    # A whole-bucket weights URI has nothing to condition on.
    v = one(doc_of(stacks, "beta-small-gcp"), "google_storage_bucket_iam_member")
    assert v["bucket"] == "beta-weights" and "condition" not in v


def test_a_shared_compile_cache_is_read_and_created_on_its_prefix_only(stacks):
    """compile_cache_uri: objectViewer and objectCreator on its bucket, both conditioned on
    its prefix (the same condition as the weights'); no other grant writes anything."""
    members = resources(doc_of(stacks, "beta-flex-gcp"), "google_storage_bucket_iam_member")
    by_role = {(m["bucket"], m["role"]): m for m in members}
    assert set(by_role) == {("beta-weights", "roles/storage.objectViewer"),
                            ("beta-cache", "roles/storage.objectViewer"),
                            ("beta-cache", "roles/storage.objectCreator")}
    for role in ("roles/storage.objectViewer", "roles/storage.objectCreator"):
        expr = by_role[("beta-cache", role)]["condition"]["expression"]
        assert 'resource.name.startsWith("projects/_/buckets/beta-cache/objects/compile/")' in expr


def test_outputs_named_resource_attr(stacks):
    outs = doc_of(stacks, "acme-chat-70b-gcp")["output"]
    assert {"instance_group_manager_name", "instance_group_manager_self_link",
            "instance_template_self_link", "forwarding_rule_ip_address",
            "service_account_email", "autoscaler_name"} <= set(outs)
    assert outs["forwarding_rule_ip_address"]["value"].endswith(".ip_address}")
    assert not any(o.get("sensitive") for o in outs.values())


def test_cdktf_testing_assertions():
    from cdktn import Testing

    from poolctl.bootscript import render_boot_script
    from poolctl_stacks.gcp.stack import GcpPoolStack

    cfg = load_config(GCP_EXAMPLES["acme-mistral-24b-gcp"])
    pool = cfg.pools[0]
    app = Testing.app()
    stack = GcpPoolStack(app, "t", cfg=cfg, pool=pool,
                         user_data=render_boot_script(cfg, pool, "gcp"))
    synthesized = Testing.synth(stack)
    assert Testing.to_have_resource_with_properties(
        synthesized, "google_compute_region_instance_group_manager",
        {"target_stopped_size": "${var.warm_nodes}", "standby_policy": {"mode": "SCALE_OUT_POOL"},
         "distribution_policy_target_shape": "BALANCED"})
    assert Testing.to_have_resource_with_properties(
        synthesized, "google_compute_region_autoscaler",
        {"autoscaling_policy": {"scale_in_control": {"max_scaled_in_replicas": {"fixed": 1}}}})
    assert Testing.to_have_resource_with_properties(
        synthesized, "google_compute_instance_template",
        {"machine_type": "a3-highgpu-8g", "shielded_instance_config": {"enable_vtpm": True}})
    assert not Testing.to_have_resource(synthesized, "google_compute_address")
    assert not Testing.to_have_resource(synthesized, "google_compute_router_nat")


RUNTIME_VARS = {"min_nodes", "max_nodes", "warm_nodes", "max_surge_fixed",
                "max_unavailable_fixed"}


def _apply_env(pool, *, no_surge: bool, zones: int, **group) -> dict[str, str]:
    """What `rollout start --cloud gcp` passes to Terraform for a group of these sizes
    (the MIG lookup `--no-surge` makes for the zone count answered locally)."""
    from poolctl.clouds.base import Group
    from poolctl.clouds.gcp.ops import GcpOps
    from poolctl.sizing import plan_pool

    ops = GcpOps()
    pytest.MonkeyPatch().setattr(ops, "get_mig", lambda *a: SimpleNamespace(  # no undo:
        distribution_policy=SimpleNamespace(zones=[object()] * zones)))  # ops is local
    sizes = {"min_nodes": 1, "max_nodes": 6, "desired_nodes": 1, "warm_min_nodes": 2,
             "warm_state": "stopped", **group}
    g = Group(cloud=Cloud.gcp, name="mig", region="r", version="t",
              raw_id="projects/p/regions/r/instanceGroupManagers/mig", **sizes)
    return ops.rollout_apply_env(g, plan_pool(pool, Cloud.gcp), no_surge=no_surge)


def test_runtime_sizes_are_variables(stacks):
    # The sizes `warm` and `rollout start --no-surge` change are variables whose defaults are
    # the file's (chat-70b: min 1, max 6, 2 stopped standby, surge 3 over 3 zones), so
    # `deploy` applies the file and a runtime apply passes what the group runs now.
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    v = doc["variable"]
    assert {k: (x["type"], x["default"]) for k, x in v.items()} == {
        "min_nodes": ("number", 1), "max_nodes": ("number", 6), "warm_nodes": ("number", 2),
        "max_surge_fixed": ("number", 3), "max_unavailable_fixed": ("number", 0)}
    for k in ("min_nodes", "max_nodes", "warm_nodes"):
        assert "poolctl's runtime commands pass it" in v[k]["description"], k
        assert "keeps what `warm` set" in v[k]["description"], k
    assert "--no-surge" in v["max_surge_fixed"]["description"]
    mig = one(doc, "google_compute_region_instance_group_manager")
    assert mig["target_stopped_size"] == "${var.warm_nodes}"
    assert mig["lifecycle"]["ignore_changes"] == ["target_size", "version"]
    assert mig["target_size"] == 1  # a number: ignored after creation anyway
    up = mig["update_policy"]
    assert (up["max_surge_fixed"], up["max_unavailable_fixed"]) == (
        "${var.max_surge_fixed}", "${var.max_unavailable_fixed}")
    # A regional MIG over 3 zones takes 0 or >= 3: a bad TF_VAR fails the plan.
    (rule,) = v["max_surge_fixed"]["validation"]
    assert rule["condition"] == "${var.max_surge_fixed == 0 || var.max_surge_fixed >= 3}"
    # Three zones for mistral-24b too.
    (rule,) = doc_of(stacks, "acme-mistral-24b-gcp")["variable"]["max_unavailable_fixed"][
        "validation"]
    assert rule["condition"].endswith(">= 3}")


def test_variables_are_what_rollout_apply_env_passes(stacks):
    cfg = load_config(GCP_EXAMPLES["acme-chat-70b-gcp"])
    env = _apply_env(cfg.pools[0], no_surge=True, zones=3, warm_min_nodes=5)
    assert {k.removeprefix("TF_VAR_") for k in env} == RUNTIME_VARS
    for name in ("acme-chat-70b-gcp", "acme-mistral-24b-gcp", "beta-small-gcp"):
        assert set(doc_of(stacks, name)["variable"]) == RUNTIME_VARS, name
    # What the apply then sets: 5 standby VMs (warm), no surge, one VM per zone down.
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    vals = {k.removeprefix("TF_VAR_"): int(x) for k, x in env.items()}
    mig = one(doc, "google_compute_region_instance_group_manager")
    assert resolved(doc, mig["target_stopped_size"], vals) == 5
    assert (resolved(doc, mig["update_policy"]["max_surge_fixed"], vals),
            resolved(doc, mig["update_policy"]["max_unavailable_fixed"], vals)) == (0, 3)


def test_terraform_takes_the_runtime_variables(stacks, tmp_path):
    """The variable blocks with the real CLI (they need no provider): the values a runtime
    apply passes plan; a surge the regional MIG would refuse fails at plan, naming it."""
    tf = os.environ.get("POOLCTL_TERRAFORM") or shutil.which("terraform") or shutil.which(
        "tofu")
    if not tf:
        pytest.skip("no terraform/tofu on PATH: cannot evaluate the variable blocks")
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    (tmp_path / "main.tf.json").write_text(json.dumps({
        "variable": doc["variable"],
        "output": {k: {"value": f"${{var.{k}}}"} for k in doc["variable"]}}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("TF_VAR_")}
    base.update(CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1")
    base.pop("TF_CLI_CONFIG_FILE", None)

    def run(*args, env=None):
        return subprocess.run([tf, *args, "-no-color"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**base, **(env or {})})

    assert run("init", "-input=false").returncode == 0
    cfg = load_config(GCP_EXAMPLES["acme-chat-70b-gcp"])
    env = _apply_env(cfg.pools[0], no_surge=True, zones=3, min_nodes=2, warm_min_nodes=4)
    ok = run("apply", "-auto-approve", "-input=false", env=env)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(run("output", "-json").stdout)
    assert {k: o["value"] for k, o in out.items()} == {
        "min_nodes": 2, "max_nodes": 6, "warm_nodes": 4, "max_surge_fixed": 0,
        "max_unavailable_fixed": 3}
    bad = run("plan", "-input=false", env={**env, "TF_VAR_max_surge_fixed": "1"})
    assert bad.returncode != 0
    assert "max_surge_fixed: give 0 or at least 3 (the MIG's zones)." in bad.stderr


def test_pool_without_warm_pool_keeps_an_empty_standby_pool():
    """warm_pool.replicas 0 (stopped): the standby pool is declared empty, so that what
    `warm --replicas N` adds at runtime survives a rollout's apply (TF_VAR_warm_nodes) with
    the same policy and initial delay as a pool deployed with a warm pool."""
    from cdktn import Testing

    from poolctl.bootscript import render_boot_script
    from poolctl_stacks.gcp.stack import GcpPoolStack

    cfg = load_config(GCP_EXAMPLES["acme-chat-70b-gcp"])
    pool = cfg.pools[0]
    pool = pool.model_copy(update={"warm_pool": pool.warm_pool.model_copy(
        update={"replicas": 0})})
    stack = GcpPoolStack(Testing.app(), "t", cfg=cfg, pool=pool,
                         user_data=render_boot_script(cfg, pool, "gcp"))
    doc = json.loads(Testing.synth(stack))
    mig = one(doc, "google_compute_region_instance_group_manager")
    assert mig["target_stopped_size"] == "${var.warm_nodes}"
    assert doc["variable"]["warm_nodes"]["default"] == 0
    assert mig["standby_policy"] == {"mode": "SCALE_OUT_POOL", "initial_delay_sec": 440}


def test_slo_alert_policies_and_dashboard(stacks):
    # The example (acme-chat-70b): a TTFT SLO only (2 s), no channel: one policy on the p90
    # (ALIGN_DELTA of the nodes' cumulative distributions, REDUCE_PERCENTILE_90 across
    # them) above 2 s for slo.alarm_after_s' default 300 s, no notification.
    doc = doc_of(stacks, "acme-chat-70b-gcp")
    (ttft,) = resources(doc, "google_monitoring_alert_policy")
    assert ttft["display_name"] == "acme-chat-70b-ttft-slo" and ttft["combiner"] == "OR"
    assert "notification_channels" not in ttft
    (cond,) = ttft["conditions"]
    th = cond["condition_threshold"]
    assert th["filter"] == ('metric.type = "custom.googleapis.com/poolctl/time_to_first_token" '
                            'AND resource.type = "gce_instance" AND '
                            'metric.labels.pool = "acme-chat-70b"')
    assert th["aggregations"] == [{"alignment_period": "60s", "per_series_aligner":
                                   "ALIGN_DELTA", "cross_series_reducer":
                                   "REDUCE_PERCENTILE_90"}]
    assert (th["comparison"], th["threshold_value"], th["duration"]) == (
        "COMPARISON_GT", 2.0, "300s")
    assert th["evaluation_missing_data"] == "EVALUATION_MISSING_DATA_INACTIVE"
    assert ttft["user_labels"] == LABELS_70B
    dash = json.loads(one(doc, "google_monitoring_dashboard")["dashboard_json"])
    assert dash["displayName"] == "acme-chat-70b"
    tiles = dash["mosaicLayout"]["tiles"]
    assert [t["widget"]["title"] for t in tiles] == [
        "Nodes in the group", "Queue: requests waiting per replica", "TTFT p50 / p90",
        "TPOT p50 / p90", "Output tokens per second",
        "KV-cache usage (0-1) and requests running"]
    assert tiles[2]["widget"]["xyChart"]["thresholds"] == [{"label": "SLO (p90)",
                                                           "value": 2.0}]
    assert "thresholds" not in tiles[3]["widget"]["xyChart"]  # no TPOT SLO
    # every tile inside the 48 columns, none overlapping
    cells = [(t["xPos"] + i, t["yPos"] + j) for t in tiles for i in range(t["width"])
             for j in range(t["height"])]
    assert len(cells) == len(set(cells)) and max(x for x, _ in cells) < 48
    # With a TPOT SLO, 600 s and a channel: two policies, both notifying the channel.
    doc = doc_of(stacks, "beta-small-gcp")
    policies = {p["display_name"]: p for p in resources(doc, "google_monitoring_alert_policy")}
    assert set(policies) == {"beta-small-ttft-slo", "beta-small-tpot-slo"}
    tpot = policies["beta-small-tpot-slo"]["conditions"][0]["condition_threshold"]
    assert (tpot["threshold_value"], tpot["duration"]) == (0.05, "600s")
    assert "time_per_output_token" in tpot["filter"]
    for p in policies.values():
        assert p["notification_channels"] == ["projects/beta-svc/notificationChannels/8675309"]


@pytest.mark.parametrize("stack", sorted(GCP_EXAMPLES))
def test_golden(stacks, stack):
    got = json.dumps(stacks[stack]["json"], indent=2, sort_keys=True) + "\n"
    assert_golden(GOLDEN / f"{stack}.json", got)


def test_fallback_machine_types_as_an_instance_flexibility_policy(stacks):
    mig = one(doc_of(stacks, "beta-flex-gcp"), "google_compute_region_instance_group_manager")
    # The primary first, then each fallback in the file's order (lower rank: preferred).
    assert mig["instance_flexibility_policy"] == {"instance_selections": [
        {"name": "rank-0", "rank": 0, "machine_types": ["a3-highgpu-8g"]},
        {"name": "rank-1", "rank": 1, "machine_types": ["a3-megagpu-8g"]},
        {"name": "rank-2", "rank": 2, "machine_types": ["a3-edgegpu-8g"]}]}
    # No standby pool beside it (rule fallback-warm-pool); the template keeps the primary's
    # machine type and its 16 Local SSDs, which every fallback has too (rule fallback-types).
    assert not {"standby_policy", "target_stopped_size", "target_suspended_size"} & set(mig)
    tpl = one(doc_of(stacks, "beta-flex-gcp"), "google_compute_instance_template")
    assert tpl["machine_type"] == "a3-highgpu-8g"
    assert sum(d.get("type") == "SCRATCH" for d in tpl["disk"]) == 16
    # A pool without fallbacks has no policy.
    plain = one(doc_of(stacks, "beta-small-gcp"), "google_compute_region_instance_group_manager")
    assert "instance_flexibility_policy" not in plain


@pytest.mark.parametrize("stack", [*sorted(GCP_EXAMPLES), "beta-small-gcp", "beta-flex-gcp"])
def test_checkov_passes(stacks, stack):
    failed = run_checkov(stacks[stack]["dir"])
    assert failed == [], failed


def test_https_with_a_certificate(stacks):
    """gcp.certificate: an HTTPS proxy with TLS 1.2+ on 443 and no plaintext rule; without
    it, HTTP on 80 (and `validate` warns)."""
    doc = doc_of(stacks, "beta-small-gcp")
    assert "google_compute_region_target_http_proxy" not in doc["resource"]
    proxy = one(doc, "google_compute_region_target_https_proxy")
    assert proxy["ssl_certificates"] == [
        "projects/beta-svc/regions/us-east4/sslCertificates/beta-tls"]
    assert proxy["ssl_policy"].startswith("${google_compute_region_ssl_policy.")
    policy = one(doc, "google_compute_region_ssl_policy")
    assert (policy["min_tls_version"], policy["profile"]) == ("TLS_1_2", "MODERN")
    rule = one(doc, "google_compute_forwarding_rule")
    assert rule["port_range"] == "443"
    assert rule["target"].startswith("${google_compute_region_target_https_proxy.")
    plain = doc_of(stacks, "acme-chat-70b-gcp")["resource"]
    assert "google_compute_region_target_https_proxy" not in plain
    assert "google_compute_region_ssl_policy" not in plain


def test_checkov_sees_a_loosened_template(stacks, tmp_path):
    """Control for the test above: the same JSON with a public IP, no Shielded VM and project
    SSH keys allowed must fail, so a clean run means checkov read the template."""
    doc = copy.deepcopy(doc_of(stacks, "acme-chat-70b-gcp"))
    (tpl,) = doc["resource"]["google_compute_instance_template"].values()
    tpl["network_interface"][0]["access_config"] = [{}]
    tpl["shielded_instance_config"] = {"enable_secure_boot": False, "enable_vtpm": False,
                                       "enable_integrity_monitoring": False}
    tpl["metadata"]["block-project-ssh-keys"] = "FALSE"
    (tmp_path / "cdk.tf.json").write_text(json.dumps(doc))
    failed = {f["id"] for f in run_checkov(tmp_path, skips=[])}
    assert {"CKV_GCP_40", "CKV_GCP_39", "CKV_GCP_32"} <= failed, failed


def test_terraform_validate_accepts_the_json(stacks, tmp_path):
    """The contract: the JSON works with the real CLI (validate needs the provider schema)."""
    terraform_validate(stacks["acme-chat-70b-gcp"]["dir"], tmp_path / "validate", "google")


def test_gcp_synth_never_loads_aws(tmp_path):
    mods = provider_modules_after_synth(GCP_EXAMPLES['acme-chat-70b-gcp'], "gcp", tmp_path, ROOT)
    assert any(m.startswith("cdktn_provider_google.") for m in mods)
    assert not any(m.startswith("cdktn_provider_aws") for m in mods)
    # Only the submodules the stack uses, not the package root's thousands.
    assert len(mods) < 40
    assert (tmp_path / "stacks" / "acme-chat-70b-gcp" / "cdk.tf.json").is_file()


# --- the arithmetic and parsing behind the stack, without a synth -----------------------


def _pool(text: str = VARIANT):
    return parse_config(text).pools[0]


def test_mig_sizes_by_hand():
    from poolctl.contract.gcp import MigSizes, mig_sizes
    from poolctl.sizing import plan_pool

    cfg = load_config(GCP_EXAMPLES["acme-chat-70b-gcp"])
    pool = cfg.pools[0]
    # 1 surge node over the catalog's 3 zones -> 3 (plan_pool raises it to one per zone).
    assert mig_sizes(pool, plan_pool(pool, "gcp"), 3) == MigSizes(
        target_size=1, min_nodes=1, max_nodes=6, standby=2, max_surge=3, max_unavailable=0)
    # Over 2 zones it is 2; with 8 surge replicas = 2 nodes it stays 2.
    two = pool.model_copy(update={"gcp": pool.gcp.model_copy(
        update={"zones": ["us-central1-a", "us-central1-b"]})})
    assert mig_sizes(two, plan_pool(two, "gcp"), 2).max_surge == 2
    bigger = two.model_copy(update={"rollout": pool.rollout.model_copy(
        update={"max_surge_replicas": 8})})
    assert mig_sizes(bigger, plan_pool(bigger, "gcp"), 2).max_surge == 2
    # No surge: one node per zone may be down at a time.
    none = pool.model_copy(update={"rollout": pool.rollout.model_copy(
        update={"max_surge_replicas": 0})})
    sizes = mig_sizes(none, plan_pool(none, "gcp"), 3)
    assert (sizes.max_surge, sizes.max_unavailable) == (0, 3)


def test_boot_disk_type_per_series():
    from poolctl_stacks.gcp.pool import boot_disk_type

    assert boot_disk_type("a3-highgpu-8g") == "pd-ssd"
    assert boot_disk_type("a2-ultragpu-8g") == "pd-ssd"
    assert boot_disk_type("a3-ultragpu-8g") == "hyperdisk-balanced"
    assert boot_disk_type("a4-highgpu-8g") == "hyperdisk-balanced"


def test_account_id_fits_gcp_rules():
    import re

    from poolctl_stacks.gcp.iam import account_id

    ok = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
    for name in ("acme-chat-70b", "9lives-x", "a-very-long-project-name-with-a-long-pool-name",
                 "ab-c"):
        assert ok.match(account_id(name)), account_id(name)
    assert account_id("acme-chat-70b") == "acme-chat-70b"
    long = "a-very-long-project-name-with-a-long-pool-name"
    assert account_id(long) != account_id(long + "2")  # the hash keeps them apart


def test_zones_missing_from_catalog_is_one_clear_line():
    """No zones to spread the MIG over: the rules refuse it before any stack is built
    (`refuse_invalid` is what synthesis runs first)."""
    from poolctl.errors import OperationFailed
    from poolctl.rules import refuse_invalid

    cfg = parse_config(VARIANT.replace("region: us-east4", "region: us-south1")
                       .replace("      zones: [us-east4-a, us-east4-b]\n", "")
                       .replace("regions/us-east4/", "regions/us-south1/"))
    with pytest.raises(OperationFailed) as e:
        refuse_invalid(cfg, cfg.targets(None, "gcp"))
    msg = str(e.value)
    assert "\n" not in msg and "pools[0].gcp." in msg and "region-offered" in msg


def test_bad_subnetwork_path_is_one_clear_line():
    from poolctl_stacks.gcp.network import subnet_ref

    # A subnetwork of another region is refused when the file loads (validate == synth).
    with pytest.raises(UsageError) as e:
        _pool(VARIANT.replace("regions/us-east4/subnetworks/", "regions/us-west1/subnetworks/"))
    assert ("pools[0].gcp.subnetwork: names a subnetwork outside the placement's region"
            in str(e.value))
    assert "\n" not in str(e.value)
    plain = _pool(VARIANT.replace("projects/beta-host/regions/us-east4/subnetworks/gpu", "gpu"))
    assert subnet_ref(plain.gcp) == ("beta-host", "us-east4", "gpu")


def test_certificate_name_or_self_link():
    from poolctl_stacks.gcp.pool import certificate_link

    link = "projects/p/regions/r/sslCertificates/c"
    assert certificate_link("c", "p", "r") == link
    assert certificate_link(link, "x", "y") == link


def test_autoscaler_leaves_scaling_schedules_to_the_runtime(stacks):
    # Launch windows (`warm --from`) are scaling schedules poolctl writes at runtime; the
    # provider's scaling_schedules is optional, not computed, so the stack writes none and
    # ignores them, and a deploy keeps them.
    a = one(doc_of(stacks, "acme-chat-70b-gcp"), "google_compute_region_autoscaler")
    assert "scaling_schedules" not in a["autoscaling_policy"]
    assert a["lifecycle"]["ignore_changes"] == ["autoscaling_policy[0].scaling_schedules"]
def test_reservation_affinity_as_the_provider_names_it(stacks):
    """gcp.capacity.reservations: specific names become the template's reservation_affinity
    (google provider: type, specific_reservation {key, values}); the default (`any`, GCE's
    own) writes nothing, so the examples' stacks are unchanged."""
    named = one(doc_of(stacks, "beta-small-gcp"), "google_compute_instance_template")
    assert named["reservation_affinity"] == {
        "type": "SPECIFIC_RESERVATION",
        "specific_reservation": {"key": "compute.googleapis.com/reservation-name",
                                 "values": ["a3-reserved-a", "a3-reserved-b"]}}
    plain = one(doc_of(stacks, "acme-chat-70b-gcp"), "google_compute_instance_template")
    assert "reservation_affinity" not in plain
