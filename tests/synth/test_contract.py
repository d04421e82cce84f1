"""The stacks, the runtime and the rules agree (issue 9, points 1 and 4; issue 13, point 1).

One synth (one process, one `App`) builds every example and every hidden-edge config below
on every cloud it names; the module's tests then check on the synthesized JSON:
- every `TF_VAR_` the runtime sets is a variable the stack declares (Terraform silently
  ignores an undeclared one: a rename on one side would quietly drop what `warm` set);
- every config the rules accept synthesizes, and produces its stacks (validate == synth);
- every escape hatch (override paths, raw `${...}` references, the terraform block) names
  what the provider schema in the bindings' jsii assembly has.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from poolctl.cloud import Cloud
from poolctl.clouds.base import Group
from poolctl.config import load_config, parse_config
from poolctl.rules import errors, run_checks
from poolctl.sizing import plan_pool
from tests.configs import pool_yaml
from tests.synth.provider_schema import Assembly, ProviderSchema, check_stack

pytestmark = pytest.mark.synth

ROOT = Path(__file__).resolve().parents[2]
AWS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf"
GROUP_RESOURCE = {"aws": "aws_autoscaling_group",
                  "gcp": "google_compute_region_instance_group_manager"}


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _serving(text: str, lines: str) -> str:
    return _edit(text, "      port: 8000\n", "      port: 8000\n" + lines)


def _two_pools() -> str:
    """Two pools in one file, the second sharing the first's model block by YAML alias."""
    text = pool_yaml().replace("    model:\n", "    model: &llama\n", 1)
    first = text.split("pools:\n", 1)[1]
    head, rest = first.replace("name: chat-70b", "name: chat-70b-b").split("    model: &llama\n")
    return text + head + "    model: *llama\n    serving:\n" + rest.split("    serving:\n", 1)[1]


def _longest_names() -> str:
    from poolctl.naming import MAX_BASE_AWS

    project = "p" + "r" * 39  # the longest project name
    return (pool_yaml().replace("project: acme\n", f"project: {project}\n")
            .replace("name: chat-70b", "name: " + "x" * (MAX_BASE_AWS - len(project) - 1)))


# Accepted configs at the edges the rules and the schema tests probe (tests/unit/test_rules.py,
# test_hostile_configs.py, test_config.py): (id, text). Each gets its own project name so
# that their stacks do not collide in one App (but "longest-names", whose project is the point).
EDGES = [
    ("contract-both-clouds", pool_yaml()),
    ("longest-names", _longest_names()),
    ("two-pools-alias", _two_pools()),
    ("aws-everything-on", _serving(pool_yaml(
        with_gcp=False,
        extra_aws=(
            "      ami_id: ami-0123456789abcdef0\n"
            "      root_volume_gb: 16384\n"
            "      volume_initialization_rate_mib_s: 300\n"
            "      certificate_arn: arn:aws:acm:us-east-1:111122223333:certificate/"
            "0a1b2c3d-4e5f-6789-abcd-ef0123456789\n"
            "      access_logs_bucket: acme-alb-logs\n"
            "      access_logs_prefix: pools/chat\n"
            "      ssm_access: true\n"
            "      node_access: instance-connect\n"
            "      placement_group_strategy: spread\n"
            "      network:\n"
            "        availability_zone_ids: [use1-az4, use1-az6, use1-az1]\n"
            "        vpc_cidr: 10.9.0.0/24\n"
            "        client_cidrs: [10.0.0.0/8, 192.168.0.0/16]\n")),
        f"      api_key_secret: {AWS_ARN}\n")),
    ("aws-existing-vpc", pool_yaml(
        with_gcp=False,
        extra_aws=("      network:\n"
                   "        vpc_id: vpc-0123456789abcdef0\n"
                   "        subnet_ids: [subnet-0123456789abcdef0, subnet-0fedcba987654321f]\n"))),
    ("gcp-shared-vpc-links", _serving(pool_yaml(extra_gcp=(
        "      zones: [us-central1-a, us-central1-c]\n"
        "      network: https://www.googleapis.com/compute/v1/projects/acme-host/global/"
        "networks/shared\n"
        "      subnetwork: projects/acme-host/regions/us-central1/subnetworks/gpu-nodes\n"
        "      certificate: https://www.googleapis.com/compute/v1/projects/acme-prod/regions/"
        "us-central1/sslCertificates/chat-tls\n"
        "      client_cidrs: [10.0.0.0/8]\n"
        "      boot_disk_gb: 500\n")),
        f"      api_key_secret: {{aws: {AWS_ARN}, gcp: vllm-api-key}}\n")),
    ("gcp-plain-names", pool_yaml(extra_gcp=("      network: vpc-a\n"
                                             "      subnetwork: gpu-a\n"
                                             "      certificate: chat-tls\n"))),
    ("no-warm-no-surge-one-batch", pool_yaml(warm=0, surge=0, checkpoints="[100]")),
    ("running-warm-odd-minimum", pool_yaml(warm_state="running", min_replicas=5)),
    ("tp8-one-replica", pool_yaml(tp=8, min_replicas=1, max_replicas=1, warm=0, surge=0,
                                  max_model_len=8192)),
    ("remote-state", "backend:\n  aws: {bucket: acme-tfstate, region: us-east-1, "
                     "key_prefix: pools/x, dynamodb_table: tf-locks}\n"
                     "  gcp: {bucket: acme-tfstate-gcs, prefix: pools}\n" + pool_yaml()),
    ("remote-state-lockfile", "backend:\n  aws: {bucket: acme-tfstate, region: us-east-1}\n"
                              + pool_yaml(with_gcp=False)),
    ("template-looking-strings", _serving(pool_yaml(), (
        '      extra_args: ["--x=${HOME}", "%{ for x in y }", "$${z}", "--y=\\"q\\""]\n'
        "      health_path: /health/~a(b)*c+d,e;f=g:h@i/j\n"))),
    ("largest-ports-and-waits", _edit(_edit(pool_yaml(), "port: 8000", "port: 65535"),
                                      "scale_down_stabilization_s: 900",
                                      "scale_down_stabilization_s: 86400")),
]


def _config(label: str, text: str):
    if label != "longest-names":
        project = re.sub(r"[^a-z0-9]+", "-", label)[:40].strip("-")
        text = _edit(text, "project: acme\n", f"project: {project}\n")
    return parse_config(text)


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> dict[str, dict]:
    """label -> {"cfg", "stacks": {stack name: (pool, cloud, doc)}} for examples and edges."""
    from poolctl import naming
    from poolctl_stacks.app import synth

    configs = {f.parent.name: load_config(f) for f in sorted(ROOT.glob("examples/*/poolctl.yaml"))}
    assert len(configs) >= 3
    configs |= {label: _config(label, text) for label, text in EDGES}
    batch = []
    for label, cfg in configs.items():
        targets = cfg.targets(None, None)
        assert errors(run_checks(cfg, targets)) == [], label  # each one is accepted
        batch.append((cfg, targets))
    out = tmp_path_factory.mktemp("contract")
    dirs = synth(batch, out)  # one App: the provider assemblies load once
    docs = {d.name: json.loads((d / "cdk.tf.json").read_text()) for d in dirs}
    return {label: {"cfg": cfg, "stacks": {
        (name := naming.stack_name(cfg, t.pool, t.cloud)): (t.pool, t.cloud, docs[name])
        for t in targets}}
        for (label, cfg), (_, targets) in zip(configs.items(), batch, strict=True)}


# -- 9.4: what the rules accept synthesizes ------------------------------------------------


def test_every_accepted_edge_config_produces_its_stacks(synthesized):
    for label, _ in EDGES:
        entry = synthesized[label]
        expected = {(t.pool.name, t.cloud) for t in entry["cfg"].targets(None, None)}
        assert {(p.name, c) for p, c, _ in entry["stacks"].values()} == expected, label
        for pool, cloud, doc in entry["stacks"].values():
            groups = doc["resource"].get(GROUP_RESOURCE[cloud], {})
            assert len(groups) == 1, (label, pool.name, cloud)


def test_edges_cover_both_clouds_and_the_options():
    """The list above keeps its reach: both clouds, HTTPS, access logs, zone ids, secrets,
    Shared VPC links, remote state, no warm pool."""
    text = "\n".join(t for _, t in EDGES)
    for needle in ("certificate_arn:", "access_logs_bucket:", "availability_zone_ids:",
                   "api_key_secret:", "ssm_access: true", "node_access: instance-connect",
                   "global/networks/", "subnetworks/", "sslCertificates/", "dynamodb_table:",
                   "gcp: {bucket:", "replicas: 0", "state: running", "${HOME}"):
        assert needle in text, needle


def test_a_file_the_rules_refuse_never_reaches_the_stacks():
    """The stacks check nothing: synthesis runs the rules first (one validation source)."""
    from poolctl.errors import OperationFailed
    from poolctl_stacks.app import add_stacks

    cfg = parse_config(pool_yaml(tp=3))
    with pytest.raises(OperationFailed, match=r"\[tensor-parallel\].*nothing was synthesized"):
        add_stacks(None, cfg, cfg.targets(None, None))  # refused before any construct


# -- 9.1: every TF_VAR_ the runtime sets is declared --------------------------------------


def _group(cloud: Cloud, plan) -> Group:
    n = plan.nodes
    return Group(cloud=cloud, name="g", region="r", min_nodes=n.min + 1,
                 max_nodes=n.max + 2, desired_nodes=n.min + 3, warm_min_nodes=n.warm,
                 warm_state="stopped", version="7")


def runtime_env(pool, cloud: Cloud, no_surge: bool) -> dict[str, str]:
    """What the runtime itself passes to the apply of `rollout start` (its own code, the
    cloud lookups it makes replaced by fixed answers), and `deploy --sandbox`'s image."""
    from poolctl.contract import aws as aws_contract

    plan = plan_pool(pool, cloud)
    if cloud == "aws":
        from poolctl.clouds.aws.ops import AwsOps

        ops = AwsOps()
        # The ops object is this call's alone: the stub needs no undo.
        pytest.MonkeyPatch().setattr(ops, "_resolved_version", lambda group: ("7", "8"))
        env = ops.rollout_apply_env(_group(cloud, plan), plan, no_surge=no_surge)
        return env | aws_contract.sandbox_env("ami-0123456789abcdef0")
    from poolctl.clouds.gcp.ops import GcpOps

    gcp_ops = GcpOps(client_options={"api_endpoint": "http://127.0.0.1:9"})
    stub = pytest.MonkeyPatch()  # the ops object is this call's alone: no undo
    zones = SimpleNamespace(distribution_policy=SimpleNamespace(zones=["a", "b", "c"]))
    stub.setattr(gcp_ops, "get_mig", lambda project, region, name: zones)
    group = _group(cloud, plan)
    group.raw_id = "projects/p/regions/r/instanceGroupManagers/g"
    return gcp_ops.rollout_apply_env(group, plan, no_surge=no_surge)


def undeclared(env: dict[str, str], doc: dict) -> list[str]:
    """TF_VAR_ names of `env` the stack does not declare, and values not of its type."""
    declared = doc.get("variable", {})
    out = []
    for key, value in env.items():
        assert key.startswith("TF_VAR_"), key
        name = key.removeprefix("TF_VAR_")
        if name not in declared:
            out.append(name)
        elif declared[name]["type"] == "number" and not re.fullmatch(r"-?\d+", value):
            out.append(f"{name}={value!r} (not a number)")
    return out


def test_every_runtime_variable_is_declared_in_every_stack(synthesized):
    checked = set()
    for label, entry in synthesized.items():
        for stack, (pool, cloud, doc) in entry["stacks"].items():
            for no_surge in (False, True):
                env = runtime_env(pool, cloud, no_surge)
                assert undeclared(env, doc) == [], (label, stack, no_surge)
                checked |= {(cloud, k) for k in env}
    # Both clouds, every variable the runtime knows of.
    assert {k for c, k in checked if c == "aws"} == {
        "TF_VAR_node_ami_id", "TF_VAR_launch_template_version", "TF_VAR_min_nodes",
        "TF_VAR_max_nodes", "TF_VAR_refresh_min_healthy_percentage",
        "TF_VAR_refresh_max_healthy_percentage", "TF_VAR_warm_nodes"}
    assert {k for c, k in checked if c == "gcp"} == {
        "TF_VAR_min_nodes", "TF_VAR_max_nodes", "TF_VAR_warm_nodes", "TF_VAR_max_surge_fixed",
        "TF_VAR_max_unavailable_fixed"}


def test_no_tf_var_is_spelled_outside_the_contract(synthesized):
    """A TF_VAR_ spelled as a literal anywhere in the runtime (outside poolctl.contract, e.g.
    the sandbox AMI of poolctl/deploy.py) must still name a variable some stack declares."""
    declared = {n for e in synthesized.values() for _, _, d in e["stacks"].values()
                for n in d.get("variable", {})}
    for path in sorted((ROOT / "cli").rglob("*.py")):
        for name in re.findall(r"TF_VAR_([a-z][a-z0-9_]*)", path.read_text()):
            assert name in declared, f"{path.relative_to(ROOT)}: TF_VAR_{name} is undeclared"


def test_a_rename_on_one_side_only_fails(synthesized, monkeypatch):
    """The check above is not vacuous: rename a variable on the runtime's side only (the
    stack was synthesized with the old name), or on the stack's side only, and it fails."""
    from poolctl.contract import Var
    from poolctl.contract import aws as aws_contract
    from poolctl.contract import gcp as gcp_contract

    entry = synthesized["llama-70b-p5"]["stacks"]
    (aws_pool, _, aws_doc), = [v for v in entry.values() if v[1] == "aws"]
    (gcp_pool, _, gcp_doc), = [v for v in entry.values() if v[1] == "gcp"]
    with monkeypatch.context() as m:
        m.setattr(aws_contract, "WARM_NODES", Var("warm_node_count", "number", ""))
        m.setattr(gcp_contract, "MAX_SURGE_FIXED", Var("max_surge", "number", ""))
        assert undeclared(runtime_env(aws_pool, "aws", False), aws_doc) == ["warm_node_count"]
        assert undeclared(runtime_env(gcp_pool, "gcp", True), gcp_doc) == ["max_surge"]
    for doc, cloud, pool, name in ((aws_doc, "aws", aws_pool, "min_nodes"),
                                   (gcp_doc, "gcp", gcp_pool, "max_nodes")):
        renamed = copy.deepcopy(doc)
        renamed["variable"][name + "_count"] = renamed["variable"].pop(name)
        assert undeclared(runtime_env(pool, cloud, False), renamed) == [name]


# -- 13.1: escape hatches against the provider schema -------------------------------------


@pytest.fixture(scope="module")
def schemas():
    return {"aws": ProviderSchema("aws"), "google": ProviderSchema("google")}, Assembly("cdktn")


def test_escape_hatches_match_the_provider_schema(synthesized, schemas):
    providers, backend = schemas
    seen = set()
    for label, entry in synthesized.items():
        for stack, (_, cloud, doc) in entry["stacks"].items():
            assert check_stack(doc, providers, backend) == [], (label, stack)
            seen.add(cloud)
    assert seen == {"aws", "gcp"}


OVERRIDE_TYPOS = {  # what each escape hatch of the stacks becomes, misspelled
    "count": "cuont",  # poolctl_stacks/aws/pool.py: the SSM lookup only without an AMI
    "default_labels": "default_lables",  # poolctl_stacks/gcp/stack.py: labels on every resource
    "terraform.required_providers.aws": "terraform.required_providers.amazon",  # base.py
}


def test_a_misspelled_override_fails_in_either_stack(schemas, tmp_path, monkeypatch):
    """Synthesize with every `add_override` path of the stacks misspelled: the check names
    each one. (The bindings themselves accept any override path.)"""
    import cdktn

    from poolctl_stacks.app import synth

    providers, backend = schemas
    for cls in (cdktn.TerraformElement, cdktn.TerraformStack):
        original = cls.add_override

        def misspelled(self, path, value, _original=original):
            return _original(self, OVERRIDE_TYPOS.get(path, path), value)

        monkeypatch.setattr(cls, "add_override", misspelled)
    cfg = _config("typo", "backend:\n  aws: {bucket: acme-tfstate, region: us-east-1}\n"
                  + pool_yaml())
    dirs = synth([(cfg, cfg.targets(None, None))], tmp_path)
    found = {d.name: check_stack(json.loads((d / "cdk.tf.json").read_text()), providers,
                                 backend) for d in dirs}
    aws_found, gcp_found = found["typo-chat-70b-aws"], found["typo-chat-70b-gcp"]
    assert any(p.startswith("data.aws_ssm_parameter.") and p.endswith(".cuont: not an "
               "argument or block of DataAwsSsmParameterConfig") for p in aws_found), aws_found
    assert "terraform.required_providers.amazon: not hashicorp/amazon" in aws_found
    assert ("provider.google[0].default_lables: not an argument or block of "
            "GoogleProviderConfig") in gcp_found


def test_a_misspelled_reference_in_a_raw_expression_fails(synthesized, schemas):
    providers, backend = schemas
    entry = synthesized["llama-70b-p5"]["stacks"]
    for typo, cloud in ((".latest_version", "aws"), (".ip_cidr_range", "gcp"),
                        (".private_ip_google_access", "gcp"), ("var.launch_template_version",
                                                               "aws"),
                        # the node image's tag / label that picks the boot script variant
                        (".tags", "aws"), (".labels", "gcp")):
        (doc,) = [d for _, c, d in entry.values() if c == cloud]
        text = json.dumps(doc)
        assert typo in text, typo
        broken = json.loads(text.replace(typo, typo + "s"))  # e.g. latest_versions
        assert check_stack(broken, providers, backend), typo
