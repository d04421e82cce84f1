"""`aws.node_access: instance-connect` and `gcp.node_access: iap`: the one SSH path into a
pool's nodes, for `poolctl nodes check --access instance-connect|iap`. Off by default (the
examples' stacks keep port 22 closed: tests/synth/test_aws_stack.py, test_gcp_stack.py)."""

from __future__ import annotations

import json

import pytest

from poolctl.cloud import Cloud
from poolctl.config import load_config, parse_config
from tests.synth.util import ROOT, run_checkov

pytestmark = pytest.mark.synth

EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> dict:
    from poolctl_stacks.app import synth

    text = EXAMPLE.read_text()
    assert "    aws:\n" in text
    text = text.replace("    aws:\n", "    aws:\n      node_access: instance-connect\n", 1)
    cfg = parse_config(text, source="poolctl.yaml")
    assert cfg.pools[0].aws and cfg.pools[0].aws.node_access == "instance-connect"
    [d] = synth([(cfg, cfg.targets(None, Cloud.aws))], tmp_path_factory.mktemp("synth-eic"))
    return {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text())}


def test_ssh_only_from_the_instance_connect_endpoint(stack):
    res = stack["json"]["resource"]
    sgs = {k: v["name"] for k, v in res["aws_security_group"].items()}
    node_sg = next(k for k, n in sgs.items() if n == "acme-chat-70b-nodes")
    eic_sg = next(k for k, n in sgs.items() if n == "acme-chat-70b-eic")
    [endpoint] = res["aws_ec2_instance_connect_endpoint"].values()
    assert endpoint["security_group_ids"] == [f"${{aws_security_group.{eic_sg}.id}}"]
    assert endpoint["subnet_id"].startswith("${aws_subnet.network_private-0")
    assert endpoint["preserve_client_ip"] is False
    assert all(r["from_port"] != 22 for r in res["aws_vpc_security_group_ingress_rule"].values())
    [ssh_in] = res["aws_security_group_rule"].values()
    assert (ssh_in["type"], ssh_in["from_port"], ssh_in["to_port"]) == ("ingress", 22, 22)
    assert "cidr_blocks" not in ssh_in
    assert ssh_in["security_group_id"] == f"${{aws_security_group.{node_sg}.id}}"
    assert ssh_in["source_security_group_id"] == f"${{aws_security_group.{eic_sg}.id}}"
    # No key pair anywhere: the check pushes a key per node.
    assert "key_name" not in next(iter(res["aws_launch_template"].values()))


def test_off_by_default():
    cfg = load_config(EXAMPLE)
    assert cfg.pools[0].aws.node_access == "none"


def test_checkov_passes_with_the_endpoint(stack):
    failed = run_checkov(stack["dir"])
    assert failed == [], failed


# --- GCP: SSH from Identity-Aware Proxy's TCP forwarding range only ------------------------


@pytest.fixture(scope="module")
def gcp_stack(tmp_path_factory) -> dict:
    from poolctl_stacks.app import synth

    text = EXAMPLE.read_text()
    assert "    gcp:\n" in text
    text = text.replace("    gcp:\n", "    gcp:\n      node_access: iap\n", 1)
    cfg = parse_config(text, source="poolctl.yaml")
    assert cfg.pools[0].gcp and cfg.pools[0].gcp.node_access == "iap"
    [d] = synth([(cfg, cfg.targets(None, Cloud.gcp))], tmp_path_factory.mktemp("synth-iap"))
    return {"dir": d, "json": json.loads((d / "cdk.tf.json").read_text())}


def _port_22(rule: dict) -> bool:
    return any("22" in (a.get("ports") or []) for a in rule.get("allow", []))


def test_gcp_ssh_only_from_iap(gcp_stack):
    res = gcp_stack["json"]["resource"]
    [template] = res["google_compute_instance_template"].values()
    ssh = [r for r in res["google_compute_firewall"].values() if _port_22(r)]
    assert len(ssh) == 1
    [rule] = ssh
    assert rule["name"] == "acme-chat-70b-allow-iap-ssh"
    assert rule["direction"] == "INGRESS"
    assert rule["source_ranges"] == ["35.235.240.0/20"]  # IAP's TCP forwarding range
    assert rule["allow"] == [{"protocol": "tcp", "ports": ["22"]}]
    # The pool's nodes only, by the tag the instance template gives them.
    assert rule["target_tags"] == template["tags"] == ["acme-chat-70b-node"]
    assert rule["log_config"] == {"metadata": "INCLUDE_ALL_METADATA"}
    # Who may log in is OS Login's call; no project-wide keys.
    assert template["metadata"]["enable-oslogin"] == "TRUE"
    assert template["metadata"]["block-project-ssh-keys"] == "TRUE"
    # No external address: IAP is the way in.
    assert all("access_config" not in nic for nic in template["network_interface"])


def test_gcp_off_by_default():
    cfg = load_config(EXAMPLE)
    assert cfg.pools[0].gcp.node_access == "none"
    with pytest.raises(Exception, match="node_access"):
        parse_config(EXAMPLE.read_text().replace(
            "    gcp:\n", "    gcp:\n      node_access: instance-connect\n", 1))


def test_gcp_checkov_passes_with_iap(gcp_stack):
    failed = run_checkov(gcp_stack["dir"])
    assert failed == [], failed
