"""`aws.node_access: instance-connect`: the one SSH path into a pool's nodes, for
`poolctl nodes check --access instance-connect`. Off by default (the examples' stacks keep
port 22 closed: tests/synth/test_aws_stack.py)."""

from __future__ import annotations

import json

import pytest

from poolctl.config import load_config, parse_config
from tests.synth.util import ROOT, run_checkov

pytestmark = pytest.mark.synth

EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> dict:
    from poolctl.stacks.app import synth

    text = EXAMPLE.read_text()
    assert "    aws:\n" in text
    text = text.replace("    aws:\n", "    aws:\n      node_access: instance-connect\n", 1)
    cfg = parse_config(text, source="poolctl.yaml")
    assert cfg.pools[0].aws.node_access == "instance-connect"
    [d] = synth([(cfg, cfg.targets(None, "aws"))], tmp_path_factory.mktemp("synth-eic"))
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
