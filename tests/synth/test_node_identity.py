"""What the nodes' identity may do, from the synthesized stacks (issue 8, points 3 and 4).

One pool with the defaults and one with `aws.ssm_access` and an API-key secret per cloud,
both clouds, synthesized in one process. The AWS role reads the weights prefix built from
the parsed URI, never SSM parameters, gets Session Manager's channel only when asked, and
reads exactly the named secret; the GCP service account gets the accessor role on that one
secret. No secret value exists anywhere in a stack (poolctl never sees one).
"""

from __future__ import annotations

import json

import pytest

from poolctl.config import parse_config
from tests.configs import pool_yaml

pytestmark = pytest.mark.synth

ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf"


def _config():
    base = pool_yaml()
    pools = base.split("pools:\n", 1)[1]
    second = pools.replace("name: chat-70b", "name: keyed").replace(
        "      port: 8000\n",
        f"      port: 8000\n      api_key_secret: {{aws: {ARN}, gcp: vllm-key}}\n").replace(
        "      weights_uri: s3://acme-models/llama-3.1-70b/\n",
        "      weights_uri: s3://acme-models/llama-3.1-70b/\n      ssm_access: true\n")
    return parse_config(base + second)


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    from poolctl_stacks.app import synth

    cfg = _config()
    out = tmp_path_factory.mktemp("identity")
    dirs = synth([(cfg, cfg.targets(None, None))], out)
    return {d.name: json.loads((d / "cdk.tf.json").read_text()) for d in dirs}


def _resources(doc, rtype):
    return list(doc.get("resource", {}).get(rtype, {}).values())


def _node_policy(doc) -> dict[str, dict]:
    (pol,) = [p for p in _resources(doc, "aws_iam_role_policy") if p["name"].endswith("-node")]
    return {s["Sid"]: s for s in json.loads(pol["policy"])["Statement"]}


def test_default_role_has_no_ssm_at_all(docs):
    doc = docs["acme-chat-70b-aws"]
    # AmazonSSMManagedInstanceCore carried ssm:GetParameter* on "*": no managed policy now.
    assert _resources(doc, "aws_iam_role_policy_attachment") == []
    stmts = _node_policy(doc)
    assert not [a for s in stmts.values() for a in s["Action"] if a.startswith("ssm")]
    assert "ApiKeySecret" not in stmts
    assert [s["Sid"] for s in stmts.values() if s["Resource"] == ["*"]] == ["QueueMetric"]


def test_weights_arn_from_the_parsed_parts(docs):
    stmts = _node_policy(docs["acme-chat-70b-aws"])
    (read,) = stmts["ReadWeights"]["Resource"]
    assert read.startswith("arn:${") and read.endswith(":s3:::acme-models/llama-3.1-70b/*")
    assert stmts["ListWeights"]["Resource"][0].endswith(":s3:::acme-models")
    assert stmts["ListWeights"]["Condition"] == {"StringLike": {"s3:prefix": ["llama-3.1-70b/*"]}}


def test_ssm_access_grants_session_manager_only(docs):
    stmts = _node_policy(docs["acme-keyed-aws"])
    assert sorted(stmts["SessionManagerChannels"]["Action"]) == [
        "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"]
    reg = stmts["SessionManagerRegistration"]
    assert reg["Action"] == ["ssm:UpdateInstanceInformation"]
    assert reg["Resource"][0].endswith(":instance/*")
    assert not [a for s in stmts.values() for a in s["Action"] if a.startswith("ssm:Get")]


def test_api_key_secret_read_on_that_secret_only(docs):
    stmts = _node_policy(docs["acme-keyed-aws"])
    assert stmts["ApiKeySecret"] == {"Sid": "ApiKeySecret", "Effect": "Allow",
                                     "Action": ["secretsmanager:GetSecretValue"],
                                     "Resource": [ARN]}
    gcp = docs["acme-keyed-gcp"]
    (member,) = _resources(gcp, "google_secret_manager_secret_iam_member")
    assert (member["project"], member["secret_id"], member["role"]) == (
        "acme-prod", "vllm-key", "roles/secretmanager.secretAccessor")
    assert member["member"].startswith("serviceAccount:${google_service_account.")
    assert _resources(docs["acme-chat-70b-gcp"], "google_secret_manager_secret_iam_member") == []
    # The reference is in the node policy and the boot script; no output carries it.
    for doc in (docs["acme-keyed-aws"], gcp):
        assert "vllm-key" not in json.dumps(doc.get("output", {}))


def test_gcp_condition_is_built_from_escaped_literals(docs):
    (member,) = _resources(docs["acme-chat-70b-gcp"], "google_storage_bucket_iam_member")
    assert member["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/acme-models/objects/llama-3.1-70b/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
        '.startsWith("llama-3.1-70b/")')
