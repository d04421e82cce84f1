"""The serving sandbox with a pool that streams its weights (`aws.weights_load: stream`): the
real boot script assumes the pool's weights role and hands the container those credentials
alone, in a file its agent renews; the stand-in engine reads the weights from the sandbox's S3
with them (vLLM's `--load-format runai_streamer` flags, checked as vLLM v0.34.0 checks them);
the node serves, then writes the weights through to its NVMe cache, checked against
manifest.json."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.plugins.sandbox import boto3_client, run_poolctl, terraform_missing
from tests.serving.pool import KEY, serving, serving_pool, wait_for
from tests.serving.standin import call

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 10.0
WEIGHTS = "s3://acme-models/llama-3.1-70b/"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # TP 8: one replica a node, where streaming is the faster path (rule weights-load); one
    # node, no warm pool.
    with serving_pool(tmp_path_factory.mktemp("stream-home"), SPEED, tp=8, min_replicas=1,
                      max_replicas=1, warm=0, aws_extra="      weights_load: stream\n") as pool:
        yield pool


def _node(served) -> str:
    [node] = [n["InstanceId"] for n in serving(served["url"])["nodes"] if n["Running"]]
    return str(node)


def test_the_engine_streams_the_weights_with_the_weights_roles_credentials(served):
    assert f"weights_uri: {WEIGHTS}" in served["cfg"].read_text()
    node = _node(served)
    console = boto3_client(served["url"], "ec2").get_console_output(
        InstanceId=node, Latest=True)["Output"]
    assert f"poolctl: weights: streamed by the engine from {WEIGHTS}" in console
    assert not re.search(r"^poolctl: phase=weights ", console, re.M)  # nothing fetched first
    # The container: vLLM's streamer flags (TP 8: the ranks share the reading), and the
    # weights role's credentials, not the node's (the stand-in docker passes none of those).
    [record] = (served["home"] / "sandbox" / "nodes" / node).rglob("poolctl-serving.json")
    args = json.loads(record.read_text())["args"]
    at = args.index("--model")
    assert args[at:at + 4] == ["--model", WEIGHTS, "--load-format", "runai_streamer"]
    assert args[at + 4:at + 6] == ["--model-loader-extra-config", '{"distributed": true}']
    log = record.with_suffix(".log").read_text()
    streamed = re.search(r"Run:ai Model Streamer from (\S+) as (\S+): (\d+) objects", log)
    assert streamed, log[-2000:]
    assert streamed[1] == WEIGHTS
    # moto's STS names the session's role as AWS does: assumed-role/ROLE/SESSION
    assert re.fullmatch(rf"arn:aws:sts::\d{{12}}:assumed-role/acme-chat-70b-weights/"
                        rf"poolctl-{node}", streamed[2]), streamed[2]
    assert int(streamed[3]) == 3  # config.json, manifest.json, the safetensors file
    # the env-file that carried them is gone once docker has read it
    assert not list((served["home"] / "sandbox" / "nodes" / node).rglob("serving.env"))
    status, body = call(served["lb"], "/v1/completions",
                        {"model": "meta-llama/Llama-3.1-70B-Instruct", "prompt": "a b c",
                         "max_tokens": 3}, key=KEY)
    assert status == 200, body


def test_the_node_writes_the_weights_through_to_its_cache_after_it_serves(served):
    node = _node(served)
    ec2 = boto3_client(served["url"], "ec2")

    def written() -> str | None:
        out = ec2.get_console_output(InstanceId=node, Latest=True)["Output"]
        return out if "poolctl: weights: written through to the NVMe cache" in out else None

    console = wait_for("the weights written through", written, timeout=120)
    # after the node served: the boot's total comes first
    assert console.index("phase=total") < console.index("written through"), console[-3000:]
    [marker] = (served["home"] / "sandbox" / "nodes" / node).rglob(".poolctl-complete")
    assert marker.read_text() == f"{WEIGHTS} 1\n"
    assert "weights: 2 of 2 files verified" in console  # config.json, the safetensors file
    # the ledger has no weights phase for this boot (the engine's load is its readiness)
    r = run_poolctl(served["home"], "nodes", "--sandbox", "-f", str(served["cfg"]), "--cloud",
                    "aws", "--json")
    assert r.returncode == 0, r.stderr
    [pool] = json.loads(r.stdout)["pools"]
    [row] = [n for n in pool["nodes"] if n["id"] == node]
    boot = row["boots"][-1]
    assert boot["weights_streamed"] and not boot["weights_cached"], boot
    phases = boot["phases"]
    assert "weights" not in phases and {"serving", "readiness"} <= set(phases), phases


def test_the_node_agent_renews_the_containers_credentials_before_their_hour_is_up(served):
    """The role's session lasts an hour; docker restarts a crashed engine with the container's
    first environment. So the environment names a file (mounted read-only), never a key, and
    the node agent's periodic run assumes the role again once the file is 45 minutes old: an
    engine restarted later still streams."""
    folder = served["home"] / "sandbox" / "nodes" / _node(served)
    [creds_dir] = folder.rglob("weights-aws")
    creds = creds_dir / "credentials"
    assert creds_dir.stat().st_mode & 0o777 == 0o700 and creds.stat().st_mode & 0o777 == 0o600
    first = creds.read_text()
    assert first.startswith("[default]\naws_access_key_id = ") and "aws_session_token" in first
    # the file as it stands 50 minutes into its session (CREDENTIALS_RENEW_S is 2,700 s)
    old = creds.stat().st_mtime - 3000
    os.utime(creds, (old, old))
    queue_log = folder / "queue.log"

    def renewed() -> bool:
        log = queue_log.read_text() if queue_log.exists() else ""
        return ("poolctl: weights: credentials renewed for acme-chat-70b-weights" in log
                and creds.stat().st_mtime > old + 2000)

    wait_for("the node agent's renewal", renewed, timeout=90)
    again = creds.read_text()
    assert again != first and again.startswith("[default]\naws_access_key_id = ")
    assert creds.stat().st_mode & 0o777 == 0o600
    assert not [p for p in creds_dir.iterdir() if p.name != "credentials"]  # no temp left
    # the engine the renewal happened beside serves on
    status, body = call(served["lb"], "/v1/models", key=KEY)
    assert status == 200, body
