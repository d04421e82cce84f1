"""The AWS pool stack: assertions on the synthesized JSON, a golden file per example stack,
checkov with named skips, and `terraform validate` with the real CLI where present.

Regenerate the golden files with `POOLCTL_UPDATE_GOLDEN=1 pytest tests/synth`.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config, parse_config
from poolctl.errors import UsageError
from tests.plugins.golden import assert_golden
from tests.synth.util import (
    checkov_config_skips,
    provider_modules_after_synth,
    run_checkov,
    synth_without_and_with_record,
    terraform_validate,
)

pytestmark = pytest.mark.synth

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "synth"
AWS_EXAMPLES = {
    "acme-chat-70b-aws": ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml",
    "acme-qwen-7b-aws": ROOT / "examples" / "qwen-7b-p4d" / "poolctl.yaml",
}

# checkov skips live in the repository's .checkov.yaml, each with its reason; with a
# certificate, access logs and zone IDs set, only this choice remains.
ALWAYS_SKIPPED = ["CKV_AWS_150"]


def _synth(configs, outdir):
    from poolctl_stacks.app import synth

    return synth(configs, outdir)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("synth-aws")
    configs = []
    for path in AWS_EXAMPLES.values():
        cfg = load_config(path)
        configs.append((cfg, cfg.targets(None, Cloud.aws)))
    dirs = _synth(configs, out)
    return {d.name: {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text())}
            for d in dirs}


def resources(doc: dict, rtype: str) -> list[dict]:
    return list(doc["resource"].get(rtype, {}).values())


def var_default(doc: dict, value):
    """A `${var.NAME}` reference as deploy resolves it: the variable's default."""
    m = re.fullmatch(r"\$\{var\.(\w+)\}", str(value))
    return doc["variable"][m.group(1)]["default"] if m else value


def one(doc: dict, rtype: str) -> dict:
    found = resources(doc, rtype)
    assert len(found) == 1, f"expected one {rtype}, found {len(found)}"
    return found[0]


def test_every_example_has_a_stack(stacks):
    assert set(stacks) == set(AWS_EXAMPLES)


def test_terraform_block_admits_mirror_and_6x(stacks):
    tf = stacks["acme-chat-70b-aws"]["json"]["terraform"]
    assert tf["required_providers"]["aws"] == {
        "source": "hashicorp/aws", "version": ">= 5.100.0, < 7.0.0"}
    assert tf["backend"] == {"local": {"path": "terraform.tfstate"}}


def test_asg_sizes_from_replicas(stacks):
    # chat-70b: TP 2 -> 4 replicas/node; min 4 -> 1 node, max 24 -> 6, warm 8 -> 2,
    # surge 4 -> 1 node: the group's max is 6 (max_replicas) outside a rollout; `rollout
    # start` passes max_nodes 6 + 1 = 7 for the rollout's time.
    doc = stacks["acme-chat-70b-aws"]["json"]
    asg = one(doc, "aws_autoscaling_group")
    # Sizes that runtime commands change are variables; deploy applies their defaults.
    assert (asg["min_size"], asg["desired_capacity"]) == ("${var.min_nodes}",) * 2
    assert asg["max_size"] == "${var.max_nodes}"
    assert (var_default(doc, asg["min_size"]), var_default(doc, asg["max_size"])) == (1, 6)
    assert asg["warm_pool"] == {
        "pool_state": "Stopped", "min_size": "${var.warm_nodes}",
        "max_group_prepared_capacity": "${(var.min_nodes + var.warm_nodes)}",
        "instance_reuse_policy": {"reuse_on_scale_in": True},
    }
    assert var_default(doc, asg["warm_pool"]["min_size"]) == 2  # prepared: 1 + 2 = 3
    assert asg["lifecycle"]["ignore_changes"] == ["desired_capacity"]
    assert asg["health_check_type"] == "ELB"
    assert "placement_group" not in asg
    hook = asg["initial_lifecycle_hook"][0]
    assert hook["name"] == "poolctl-node-ready"
    assert hook["default_result"] == "ABANDON"
    # qwen-7b: TP 1 -> 8 replicas/node; warm 8 running -> 1 node kept Running.
    doc = stacks["acme-qwen-7b-aws"]["json"]
    asg = one(doc, "aws_autoscaling_group")
    assert (var_default(doc, asg["min_size"]), var_default(doc, asg["max_size"])) == (1, 4)
    assert asg["warm_pool"]["pool_state"] == "Running"


def test_instance_refresh_follows_rollout(stacks):
    asg = one(stacks["acme-chat-70b-aws"]["json"], "aws_autoscaling_group")
    ref = asg["instance_refresh"]
    assert ref["strategy"] == "Rolling"
    p = ref["preferences"]
    assert p["checkpoint_percentages"] == [25, 50, 100]
    assert p["auto_rollback"] is True
    # surge 1 node over a minimum of 1 node: up to 200 % healthy, never below 100 %
    # (variables: `rollout start --no-surge` passes other values for its apply).
    doc = stacks["acme-chat-70b-aws"]["json"]
    assert (var_default(doc, p["min_healthy_percentage"]),
            var_default(doc, p["max_healthy_percentage"])) == (100, 200)
    # Auto rollback needs a pinned version, never $Latest; `rollout start` pins the running
    # one through the variable, deploy leaves it empty (the newest).
    assert asg["launch_template"]["version"].endswith(".latest_version}")
    assert asg["launch_template"]["version"].startswith(
        '${var.launch_template_version != "" ? var.launch_template_version : ')
    assert doc["variable"]["launch_template_version"]["default"] == ""


def test_launch_template_is_locked_down(stacks):
    lt = one(stacks["acme-chat-70b-aws"]["json"], "aws_launch_template")
    assert lt["instance_type"] == "p5.48xlarge"
    md = lt["metadata_options"]
    assert md["http_tokens"] == "required" and md["http_put_response_hop_limit"] == 1
    ebs = lt["block_device_mappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volume_type"] == "gp3"
    (nic,) = lt["network_interfaces"]
    assert nic["associate_public_ip_address"] == "false"
    assert "interface_type" not in nic  # plain ENA: no EFA
    tagged = {t["resource_type"]: t["tags"] for t in lt["tag_specifications"]}
    assert tagged["instance"]["poolctl:role"] == "inference"
    variants = boot_variants(lt["user_data"])
    for user_data in (variants["image"], variants["whole"]):
        assert user_data.startswith("#!")
        assert "--tensor-parallel-size" in user_data
        assert "AKIA" not in user_data and "aws_secret_access_key" not in user_data.lower()


_CHOICE = re.compile(r'^\$\{lookup\(data\.aws_ami\.(?P<ami>[\w-]+)\.tags, '
                     r'"poolctl:boot-library", ""\) == "(?P<version>aws-[0-9a-f]{12})" \? '
                     r'"(?P<image>[A-Za-z0-9+/=]+)" : "(?P<whole>[A-Za-z0-9+/=]+)"\}$')


def boot_variants(user_data: str) -> dict[str, str]:
    """The launch template's user data: a choice on the node image's boot-library tag
    between the image variant and the whole script (both gzip in base64: cloud-init
    decompresses them)."""
    m = _CHOICE.match(user_data)
    assert m, user_data[:300]
    return {k: gzip.decompress(base64.b64decode(m[k])).decode()
            for k in ("image", "whole")} | {
        "version": m["version"], "ami": m["ami"]}


def test_nodes_reachable_only_from_the_load_balancer(stacks):
    doc = stacks["acme-chat-70b-aws"]["json"]
    node_sg = next(k for k, v in doc["resource"]["aws_security_group"].items()
                   if v["name"].endswith("-nodes"))
    lb_sg = next(k for k, v in doc["resource"]["aws_security_group"].items()
                 if v["name"].endswith("-lb"))
    ingress = [r for r in resources(doc, "aws_vpc_security_group_ingress_rule")
               if node_sg in r["security_group_id"]]
    assert len(ingress) == 1
    assert lb_sg in ingress[0]["referenced_security_group_id"]
    assert ingress[0]["from_port"] == ingress[0]["to_port"] == 8000
    assert "cidr_ipv4" not in ingress[0]
    lb = one(doc, "aws_lb")
    assert lb["internal"] is True
    tg = one(doc, "aws_lb_target_group")
    assert tg["health_check"]["path"] == "/health"
    assert tg["load_balancing_algorithm_type"] == "least_outstanding_requests"


def test_role_is_least_privilege(stacks):
    doc = stacks["acme-chat-70b-aws"]["json"]
    policies = {v["name"]: json.loads(v["policy"])
                for v in resources(doc, "aws_iam_role_policy")}
    node = policies["acme-chat-70b-node"]
    by_sid = {s["Sid"]: s for s in node["Statement"]}
    assert by_sid["ReadWeights"]["Action"] == ["s3:GetObject"]
    assert by_sid["ReadWeights"]["Resource"][0].endswith(":s3:::acme-models/llama-3.1-70b/*")
    assert by_sid["ListWeights"]["Condition"] == {
        "StringLike": {"s3:prefix": ["llama-3.1-70b/*"]}}
    assert by_sid["OwnLifecycleHook"]["Resource"][0].endswith(
        "autoScalingGroupName/acme-chat-70b")
    assert by_sid["QueueMetric"]["Condition"]["StringEquals"]["cloudwatch:namespace"] == "poolctl"
    for stmt in node["Statement"]:
        assert "*" not in stmt["Action"] and not any(a.endswith(":*") for a in stmt["Action"])
    assert "CompileCache" not in by_sid  # no shared compile cache: nothing to write
    assert "StreamWeights" not in by_sid  # fetched weights: no role to assume
    assert "acme-chat-70b-weights" not in policies


def test_streamed_weights_get_a_role_that_only_reads_them_assumed_by_the_node(with_options):
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    roles = {v["name"]: v for v in resources(doc, "aws_iam_role")}
    weights = roles["acme-qwen-7b-weights"]
    assert weights["max_session_duration"] == 3600  # an hour: long enough to load, no more
    trust = json.loads(weights["assume_role_policy"])["Statement"]
    [node_role_key] = [k for k, v in doc["resource"]["aws_iam_role"].items()
                       if v["name"] == "acme-qwen-7b"]
    assert trust == [{"Effect": "Allow", "Action": "sts:AssumeRole",
                      "Principal": {"AWS": f"${{aws_iam_role.{node_role_key}.arn}}"}}]
    policies = {v["name"]: json.loads(v["policy"])
                for v in resources(doc, "aws_iam_role_policy")}
    read = policies["acme-qwen-7b-weights"]["Statement"]
    assert [s["Sid"] for s in read] == ["ReadWeights", "ListWeights"]
    assert [a for s in read for a in s["Action"]] == ["s3:GetObject", "s3:ListBucket"]
    node = {s["Sid"]: s for s in policies["acme-qwen-7b-node"]["Statement"]}
    [weights_key] = [k for k, v in doc["resource"]["aws_iam_role"].items()
                     if v["name"] == "acme-qwen-7b-weights"]
    assert node["StreamWeights"] == {"Sid": "StreamWeights", "Effect": "Allow",
                                     "Action": ["sts:AssumeRole"],
                                     "Resource": [f"${{aws_iam_role.{weights_key}.arn}}"]}


def test_a_shared_compile_cache_is_the_one_prefix_nodes_write(with_options):
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    [node] = [json.loads(v["policy"]) for v in resources(doc, "aws_iam_role_policy")
              if v["name"].endswith("-node")]
    by_sid = {s["Sid"]: s for s in node["Statement"]}
    writes = [s for s in node["Statement"] if "s3:PutObject" in s["Action"]]
    assert writes == [by_sid["CompileCache"]]
    assert by_sid["CompileCache"]["Action"] == ["s3:GetObject", "s3:PutObject"]
    [resource] = by_sid["CompileCache"]["Resource"]
    assert resource.endswith(":s3:::acme-models/compile-cache/*")


def test_queue_scaling_up_fast_down_slow(stacks):
    doc = stacks["acme-chat-70b-aws"]["json"]
    pols = {p["policy_type"]: p for p in resources(doc, "aws_autoscaling_policy")}
    tt = pols["TargetTrackingScaling"]["target_tracking_configuration"]
    assert tt["target_value"] == 4
    assert tt["disable_scale_in"] is True
    spec = tt["customized_metric_specification"]
    assert (spec["namespace"], spec["metric_name"]) == ("poolctl", "RequestsWaitingPerReplica")
    down = pols["SimpleScaling"]
    assert (down["scaling_adjustment"], down["cooldown"]) == (-1, 300)
    (alarm,) = [a for a in resources(doc, "aws_cloudwatch_metric_alarm")
                if a["alarm_name"].endswith("-queue-low")]
    # 900 s of stabilization = 15 one-minute periods below half the target (2.0).
    assert (alarm["evaluation_periods"], alarm["period"], alarm["threshold"]) == (15, 60, 2.0)


def test_outputs_named_resource_attr(stacks):
    outs = stacks["acme-chat-70b-aws"]["json"]["output"]
    assert {"autoscaling_group_name", "lb_dns_name", "launch_template_id",
            "launch_template_latest_version"} <= set(outs)
    assert not any(o.get("sensitive") for o in outs.values())


def test_contract_tags_everywhere(stacks):
    doc = stacks["acme-chat-70b-aws"]["json"]
    (prov,) = doc["provider"]["aws"]
    assert prov["default_tags"][0]["tags"] == {
        "poolctl:project": "acme", "poolctl:pool": "chat-70b", "poolctl:role": "inference"}


def test_boot_script_variant_is_chosen_from_the_image_not_from_build_records(
        tmp_path, monkeypatch):
    """The same file synthesizes the same JSON on any machine: a build record in
    POOLCTL_HOME for the placement's AMI changes nothing. Both variants are in it, behind a
    conditional on the AMI's boot-library tag (read by a data source at plan time)."""
    from poolctl import bootscript
    from poolctl.bootscript import render_boot_script

    ami = "ami-0aaaaaaaaaaaaaaaa"
    without, with_record = synth_without_and_with_record(
        AWS_EXAMPLES["acme-chat-70b-aws"], "aws", ami, tmp_path, monkeypatch)
    assert with_record == without
    doc = json.loads(without)
    assert doc["variable"]["node_ami_id"]["default"] == ami
    cfg = load_config(AWS_EXAMPLES["acme-chat-70b-aws"])  # the boot script knows no AMI
    lt = one(doc, "aws_launch_template")
    variants = boot_variants(lt["user_data"])
    assert variants["version"] == bootscript.boot_library("aws")["version"]
    assert variants["whole"] == render_boot_script(cfg, cfg.pools[0], "aws", from_image=False)
    assert variants["image"] == render_boot_script(cfg, cfg.pools[0], "aws", from_image=True)
    # The data source reads the image the launch template launches (AMI variable or SSM).
    ami_data = doc["data"]["aws_ami"][variants["ami"]]
    assert ami_data["filter"] == [{"name": "image-id", "values": [lt["image_id"]]}]
    assert ami_data["include_deprecated"] is True


def test_cdktf_testing_assertions():
    from cdktn import Testing

    from poolctl.bootscript import render_boot_script
    from poolctl_stacks.aws.stack import AwsPoolStack

    cfg = load_config(AWS_EXAMPLES["acme-chat-70b-aws"])
    pool = cfg.pools[0]
    app = Testing.app()
    stack = AwsPoolStack(app, "t", cfg=cfg, pool=pool,
                         user_data=render_boot_script(cfg, pool, "aws"))
    synthesized = Testing.synth(stack)
    assert Testing.to_have_resource_with_properties(
        synthesized, "aws_launch_template",
        {"metadata_options": {"http_tokens": "required"}})
    assert Testing.to_have_resource_with_properties(
        synthesized, "aws_lb", {"internal": True, "load_balancer_type": "application"})
    assert not Testing.to_have_resource(synthesized, "aws_placement_group")


@pytest.mark.parametrize("stack", sorted(AWS_EXAMPLES))
def test_golden(stacks, stack):
    got = json.dumps(stacks[stack]["json"], indent=2, sort_keys=True) + "\n"
    assert_golden(GOLDEN / f"{stack}.json", got)


@pytest.mark.parametrize("stack", sorted(AWS_EXAMPLES))
def test_checkov_passes(stacks, stack):
    """What a user's CI sees: the current checkov with .checkov.yaml."""
    failed = run_checkov(stacks[stack]["dir"])
    assert failed == [], failed


def test_checkov_skips_are_each_needed(stacks):
    """Every skip in .checkov.yaml is a check the default pool fails (none is stale), and
    has its reason on its line."""
    failed = {f["id"] for f in run_checkov(stacks["acme-chat-70b-aws"]["dir"], skips=[])}
    assert failed == set(checkov_config_skips())
    lines = [x for x in (ROOT / ".checkov.yaml").read_text().splitlines()
             if x.strip().startswith("- CKV")]
    assert len(lines) == len(failed) and all("#" in x for x in lines)


CERTIFICATE = "arn:aws:acm:us-west-2:111122223333:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789"
TOPIC = "arn:aws:sns:us-west-2:123456789012:pool-alarms"
OPTIONS = f"""\
      compile_cache_uri: s3://acme-models/compile-cache/
      weights_load: stream
      certificate_arn: {CERTIFICATE}
      alarm_topic_arn: {TOPIC}
      access_logs_bucket: acme-lb-logs
      access_logs_prefix: pools/qwen
      network:
        availability_zone_ids: [usw2-az1, usw2-az3, usw2-az4]
"""


@pytest.fixture(scope="module")
def with_options(tmp_path_factory) -> Path:
    text = AWS_EXAMPLES["acme-qwen-7b-aws"].read_text().replace(
        "    aws:\n", f"    aws:\n{OPTIONS}").replace("    serving:\n",
                                                   "    serving:\n      balancer: sticky\n"
        ).replace("  - name: qwen-7b\n", "  - name: qwen-7b\n    slo:\n      tpot_p90_s: 0.05\n"
                  "      alarm_after_s: 600\n"
        ).replace("    scaling:\n", "    scaling:\n      predictive: forecast-and-scale\n"
                  "      predictive_target: 12.5\n      predictive_buffer_s: 240\n")
    cfg = parse_config(text)
    assert cfg.pools[0].aws and cfg.pools[0].aws.certificate_arn
    (d,) = _synth([(cfg, cfg.targets(None, Cloud.aws))], tmp_path_factory.mktemp("options"))
    return d


def test_options_tls_access_logs_zone_ids(with_options):
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    listeners = {v["protocol"]: v for v in resources(doc, "aws_lb_listener")}
    assert listeners["HTTPS"]["ssl_policy"].startswith("ELBSecurityPolicy-TLS13")
    assert listeners["HTTP"]["default_action"][0]["type"] == "redirect"
    assert one(doc, "aws_lb")["access_logs"] == {
        "bucket": "acme-lb-logs", "prefix": "pools/qwen", "enabled": True}
    subnets = {v["tags"]["Name"]: v for v in resources(doc, "aws_subnet")}
    assert {k: v.get("availability_zone_id") for k, v in subnets.items()} == {
        "acme-qwen-7b-private-0": "usw2-az1", "acme-qwen-7b-private-1": "usw2-az3",
        "acme-qwen-7b-private-2": "usw2-az4", "acme-qwen-7b-nat": "usw2-az1"}
    assert not any("availability_zone" in v for v in subnets.values())


def test_predictive_scaling_forecasts_requests_in_flight(stacks, with_options):
    """scaling.predictive: one PredictiveScaling policy, the file's mode, lead time and target
    (12.5 in flight per replica x 8 replicas of TP 1 per p4d node = 100 per node); the load
    is the pool's running requests plus the queue per replica x 8 (Sum), the scaling metric
    the same per node (Average). Without the key (the examples), no such policy."""
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    [policy] = [p for p in resources(doc, "aws_autoscaling_policy")
                if p["policy_type"] == "PredictiveScaling"]
    cfg = policy["predictive_scaling_configuration"]
    assert (cfg["mode"], cfg["scheduling_buffer_time"], cfg["max_capacity_breach_behavior"]) == (
        "ForecastAndScale", "240", "HonorMaxCapacity")
    spec = cfg["metric_specification"]
    assert spec["target_value"] == 100
    for key, stat in (("customized_load_metric_specification", "Sum"),
                      ("customized_scaling_metric_specification", "Average")):
        queries = spec[key]["metric_data_queries"]
        assert [(q["id"], q.get("metric_stat", {}).get("stat"), q["return_data"])
                for q in queries] == [("running", stat, False), ("waiting", stat, False),
                                      ("in_flight", None, True)]
        assert queries[2]["expression"] == "running + waiting * 8"
        assert [q["metric_stat"]["metric"]["metric_name"] for q in queries[:2]] == [
            "RunningRequests", "RequestsWaitingPerReplica"]
    assert policy["name"].endswith("-predictive")
    for name, stack in stacks.items():
        if name.endswith("-aws"):
            assert not [p for p in resources(stack["json"], "aws_autoscaling_policy")
                        if p["policy_type"] == "PredictiveScaling"], name


def test_sticky_balancer_is_target_group_stickiness(stacks, with_options):
    """serving.balancer: sticky: the target group's lb_cookie stickiness for a day, the
    algorithm still least outstanding (a session's first request); lor: none."""
    tg = one(json.loads((with_options / "cdk.tf.json").read_text()), "aws_lb_target_group")
    assert tg["stickiness"] == {"type": "lb_cookie", "enabled": True,
                                "cookie_duration": 24 * 3600}
    assert tg["load_balancing_algorithm_type"] == "least_outstanding_requests"
    assert "stickiness" not in one(stacks["acme-qwen-7b-aws"]["json"], "aws_lb_target_group")


def test_port_80_redirects_only_once_https_exists(with_options):
    """Terraform changes port 80 to the redirect only after the HTTPS listener is created:
    an apply that fails on the certificate leaves port 80 forwarding to the nodes (issue
    23), and a pool without a certificate orders nothing."""
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    names = {v["protocol"]: k for k, v in doc["resource"]["aws_lb_listener"].items()}
    http = doc["resource"]["aws_lb_listener"][names["HTTP"]]
    assert http["depends_on"] == [f"aws_lb_listener.{names['HTTPS']}"]
    assert http["default_action"][0]["type"] == "redirect"


def test_zones_pinned_by_name_without_ids(stacks):
    """No zone list from the account (it grows when AWS adds a zone; CKV_AWS_394): the
    region's first zone names, one per `availability_zones` (2 by default)."""
    doc = stacks["acme-qwen-7b-aws"]["json"]
    assert "aws_availability_zones" not in doc.get("data", {})
    subnets = {v["tags"]["Name"]: v["availability_zone"] for v in resources(doc, "aws_subnet")}
    assert subnets == {"acme-qwen-7b-private-0": "us-west-2a",
                       "acme-qwen-7b-private-1": "us-west-2b", "acme-qwen-7b-nat": "us-west-2a"}
    assert "access_logs" not in one(doc, "aws_lb")


def test_checkov_with_options_needs_one_skip(with_options):
    assert run_checkov(with_options, skips=ALWAYS_SKIPPED) == []


def test_zone_ids_and_a_different_zone_count_is_one_clear_line():
    text = AWS_EXAMPLES["acme-qwen-7b-aws"].read_text().replace(
        "    aws:\n", "    aws:\n      network:\n        availability_zones: 3\n"
        "        availability_zone_ids: [usw2-az1, usw2-az2]\n")
    with pytest.raises(UsageError, match="availability_zone_ids or availability_zones"):
        parse_config(text)


def test_existing_vpc_creates_no_network(tmp_path):
    text = AWS_EXAMPLES["acme-qwen-7b-aws"].read_text().replace(
        "      instance_type: p4d.24xlarge\n",
        "      instance_type: p4d.24xlarge\n      network:\n        vpc_id: vpc-0abc\n"
        "        subnet_ids: [subnet-1, subnet-2]\n")
    cfg = parse_config(text)
    (d,) = _synth([(cfg, cfg.targets(None, "aws"))], tmp_path)
    doc = json.loads((d / "cdk.tf.json").read_text())
    assert "aws_vpc" not in doc["resource"] and "aws_nat_gateway" not in doc["resource"]
    asg = one(doc, "aws_autoscaling_group")
    assert asg["vpc_zone_identifier"] == ["subnet-1", "subnet-2"]


def test_terraform_validate_accepts_the_json(stacks, tmp_path):
    """The contract: the JSON works with the real CLI (validate needs the provider schema)."""
    terraform_validate(stacks["acme-chat-70b-aws"]["dir"], tmp_path / "validate", "aws")


def test_aws_synth_never_loads_google(tmp_path):
    mods = provider_modules_after_synth(AWS_EXAMPLES['acme-qwen-7b-aws'], "aws", tmp_path, ROOT)
    assert any(m.startswith("cdktn_provider_aws.") for m in mods)
    assert not any(m.startswith("cdktn_provider_google") for m in mods)
    # Only the submodules the stack uses, not the ~2,200 the package root would import.
    assert len([m for m in mods if not m.endswith("._private")]) < 40


# aws.capacity: the group's capacity_reservation_specification carries the preference and
# the target (the Auto Scaling API reference: with open or none, no target); the launch
# template's takes a preference (open | none) only. Keys as provider 6.25's schema names them.
CR_A, CR_B = "cr-0123456789abcdef0", "cr-0fedcba9876543210"
CR_GROUP = "arn:aws:resource-groups:us-west-2:111122223333:group/p4d-reservations"
CAPACITY = {
    "ids-only": (f"{{reservations: [{CR_A}, {CR_B}], preference: reservations-only}}",
                 {"capacity_reservation_preference": "open"},
                 {"capacity_reservation_preference": "capacity-reservations-only",
                  "capacity_reservation_target": {"capacity_reservation_ids": [CR_A, CR_B]}}),
    "group-first": (f"{{reservations: {CR_GROUP}}}",
                    {"capacity_reservation_preference": "open"},
                    {"capacity_reservation_preference": "capacity-reservations-first",
                     "capacity_reservation_target": {
                         "capacity_reservation_resource_group_arns": [CR_GROUP]}}),
    "none": ("{preference: none}", {"capacity_reservation_preference": "none"}, None),
    # A Capacity Block: the launch template targets it (no preference: AWS's guide sets only
    # the target), the group nothing.
    "block": (f"{{capacity_block: {CR_B}}}",
              {"capacity_reservation_target": {"capacity_reservation_id": CR_B}}, None),
}


@pytest.fixture(scope="module")
def with_capacity(tmp_path_factory) -> dict[str, dict]:
    configs, names = [], {}
    for variant, (body, _, _) in CAPACITY.items():
        text = AWS_EXAMPLES["acme-qwen-7b-aws"].read_text().replace(
            "    aws:\n", f"    aws:\n      capacity: {body}\n").replace(
            "project: acme\n", f"project: acme-{variant}\n")
        if variant == "block":  # a block pool keeps no warm pool (config rule)
            text = text.replace("    warm_pool:\n      replicas: 8\n",
                                "    warm_pool:\n      replicas: 0\n")
        cfg = parse_config(text)
        configs.append((cfg, cfg.targets(None, Cloud.aws)))
        names[f"acme-{variant}-qwen-7b-aws"] = variant
    dirs = _synth(configs, tmp_path_factory.mktemp("capacity"))
    return {names[d.name]: {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text())}
            for d in dirs}


@pytest.mark.parametrize("variant", list(CAPACITY))
def test_capacity_reservation_specification(with_capacity, variant):
    _, lt_spec, group_spec = CAPACITY[variant]
    doc = with_capacity[variant]["json"]
    assert one(doc, "aws_launch_template")["capacity_reservation_specification"] == lt_spec
    assert one(doc, "aws_autoscaling_group").get("capacity_reservation_specification") == (
        group_spec)


def test_no_capacity_key_leaves_ec2_default(stacks):
    for stack in stacks.values():
        assert "capacity_reservation_specification" not in one(stack["json"],
                                                                "aws_launch_template")
        assert "capacity_reservation_specification" not in one(stack["json"],
                                                                "aws_autoscaling_group")


def test_checkov_with_capacity(with_capacity):
    assert run_checkov(with_capacity["ids-only"]["dir"]) == []
    assert run_checkov(with_capacity["block"]["dir"]) == []


def test_capacity_block_sets_the_market_type(with_capacity, stacks):
    # A Capacity Block admits only launches of market type capacity-block; no other pool
    # sets a market (On-Demand is EC2's default).
    lt = one(with_capacity["block"]["json"], "aws_launch_template")
    assert lt["instance_market_options"] == {"market_type": "capacity-block"}
    for doc in [*(v["json"] for k, v in with_capacity.items() if k != "block"),
                *(s["json"] for s in stacks.values())]:
        assert "instance_market_options" not in one(doc, "aws_launch_template")


def test_terraform_manages_no_scheduled_action(stacks):
    # Launch windows (`warm --from`) are the group's scheduled actions, which poolctl writes
    # at runtime: a deploy leaves them alone only because no stack resource is one
    # (aws_autoscaling_schedule), and aws_autoscaling_group has no argument for them.
    for name, stack in stacks.items():
        if name.endswith("-aws"):
            assert "aws_autoscaling_schedule" not in stack["json"].get("resource", {}), name
            asg = one(stack["json"], "aws_autoscaling_group")
            assert not {k for k in asg if "schedul" in k}, name
def test_windows_of_warm_nodes_get_a_schedule_group_and_a_role_to_put_the_warm_pool(stacks):
    # Windows without --running are EventBridge Scheduler schedules poolctl writes at runtime
    # into the stack's group; the stack makes the group and the role they run as (only
    # this account's schedules of this group; only PutWarmPool on this pool's group), and no
    # schedule, so a deploy leaves them alone.
    doc = stacks["acme-chat-70b-aws"]["json"]
    assert one(doc, "aws_scheduler_schedule_group")["name"] == "acme-chat-70b"
    assert "aws_scheduler_schedule" not in doc["resource"]
    roles = {r["name"]: json.loads(r["assume_role_policy"])
             for r in resources(doc, "aws_iam_role")}
    (trust,) = roles["acme-chat-70b-windows"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert set(trust["Condition"]) == {"StringEquals", "ArnLike"}
    assert trust["Condition"]["ArnLike"]["aws:SourceArn"].endswith(
        ":schedule/acme-chat-70b/*")
    policies = {v["name"]: json.loads(v["policy"]) for v in resources(doc, "aws_iam_role_policy")}
    (stmt,) = policies["acme-chat-70b-windows"]["Statement"]
    assert stmt["Action"] == ["autoscaling:PutWarmPool"]
    assert [r.rsplit(":", 1)[1] for r in stmt["Resource"]] == [
        "autoScalingGroupName/acme-chat-70b"]


# aws.fallback_instance_types: the group launches through a mixed instances policy over the
# one launch template, On-Demand in the overrides' order (provider 6.25's names), and has
# no warm pool (AWS refuses one beside the policy; the rule `fallback-types`).
FALLBACKS = ["p4de.24xlarge", "p5.48xlarge"]


@pytest.fixture(scope="module")
def with_fallbacks(tmp_path_factory) -> dict:
    text = AWS_EXAMPLES["acme-qwen-7b-aws"].read_text().replace(
        "    warm_pool:\n      replicas: 8\n", "    warm_pool:\n      replicas: 0\n").replace(
        "    aws:\n", f"    aws:\n      fallback_instance_types: [{', '.join(FALLBACKS)}]\n"
    ).replace("project: acme\n", "project: acme-fallback\n")
    cfg = parse_config(text)
    (d,) = _synth([(cfg, cfg.targets(None, Cloud.aws))], tmp_path_factory.mktemp("fallback"))
    return {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text())}


def test_fallback_types_as_a_mixed_instances_policy(with_fallbacks):
    doc = with_fallbacks["json"]
    asg, lt = one(doc, "aws_autoscaling_group"), one(doc, "aws_launch_template")
    assert "launch_template" not in asg and "warm_pool" not in asg
    mip = asg["mixed_instances_policy"]
    spec = mip["launch_template"]["launch_template_specification"]
    # The one launch template, at the version the group runs (pinned by a rollout).
    assert re.fullmatch(r"\$\{aws_launch_template\.\w+\.id\}", spec["launch_template_id"])
    assert "latest_version" in spec["version"]
    assert lt["instance_type"] == "p4d.24xlarge"
    assert mip["launch_template"]["override"] == [
        {"instance_type": t} for t in ["p4d.24xlarge", *FALLBACKS]]
    assert mip["instances_distribution"] == {
        "on_demand_allocation_strategy": "prioritized", "on_demand_base_capacity": 0,
        "on_demand_percentage_above_base_capacity": 100}


def test_fallback_stack_passes_checkov_and_terraform_validate(with_fallbacks, tmp_path):
    assert run_checkov(with_fallbacks["dir"]) == []
    terraform_validate(with_fallbacks["dir"], tmp_path / "validate", "aws")


def test_slo_alarms_and_dashboard(stacks, with_options):
    # The example: a TTFT SLO only (2 s), no topic: one alarm, on p90 for 5 one-minute
    # periods (slo.alarm_after_s' default, 300 s), no actions.
    doc = stacks["acme-chat-70b-aws"]["json"]
    alarms = {a["alarm_name"]: a for a in resources(doc, "aws_cloudwatch_metric_alarm")}
    ttft = alarms["acme-chat-70b-ttft-slo"]
    assert "acme-chat-70b-tpot-slo" not in alarms
    assert (ttft["namespace"], ttft["metric_name"], ttft["extended_statistic"]) == (
        "poolctl", "TimeToFirstToken", "p90")
    assert "statistic" not in ttft  # CloudWatch takes one of statistic / extended_statistic
    assert (ttft["period"], ttft["evaluation_periods"], ttft["datapoints_to_alarm"],
            ttft["threshold"], ttft["comparison_operator"]) == (
        60, 5, 5, 2.0, "GreaterThanThreshold")
    assert ttft["dimensions"] == {"AutoScalingGroupName": "acme-chat-70b"}
    assert ttft["alarm_actions"] == [] and ttft["treat_missing_data"] == "notBreaching"
    dash = one(doc, "aws_cloudwatch_dashboard")
    body = json.loads(dash["dashboard_body"])
    titles = [w["properties"]["title"] for w in body["widgets"]]
    assert titles == ["Nodes", "Queue: requests waiting per replica", "TTFT p50 / p90 (s)",
                      "TPOT p50 / p90 (s)", "Output tokens per second",
                      "KV-cache usage (0-1) and requests running"]
    slo_line = body["widgets"][2]["properties"]["annotations"]["horizontal"]
    assert slo_line == [{"label": "SLO (p90)", "value": 2.0}]
    # With a TPOT SLO, 600 s and a topic: two alarms, ten periods, the topic told both ways.
    doc = json.loads((with_options / "cdk.tf.json").read_text())
    alarms = {a["alarm_name"]: a for a in resources(doc, "aws_cloudwatch_metric_alarm")}
    tpot = alarms["acme-qwen-7b-tpot-slo"]
    assert (tpot["metric_name"], tpot["threshold"], tpot["evaluation_periods"]) == (
        "TimePerOutputToken", 0.05, 10)
    for a in (tpot, alarms["acme-qwen-7b-ttft-slo"]):
        assert a["alarm_actions"] == a["ok_actions"] == [TOPIC]
