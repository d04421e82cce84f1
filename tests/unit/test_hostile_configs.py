"""Hostile and careless configs through the real CLI (issue 8, points 3, 4, 6, 7).

Each case is the contract's example with one defect. `poolctl validate` and `poolctl synth`
must both refuse it with exit 2 and exactly one line on stderr naming the key (or, for a
file-level defect, the file and line), no traceback, and nothing written. The CLI runs
in-process through `poolctl.app.main` (the console script's entry: the same argv parsing,
error mapping and exit codes); a few cases also run as a subprocess, where a traceback
would show as such.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from poolctl.app import main
from tests.configs import pool_yaml

BASE = pool_yaml()
AWS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf"


def after(anchor: str, lines: str, text: str = BASE) -> str:
    """`text` with `lines` inserted after the (unique) line `anchor`."""
    assert text.count(anchor + "\n") == 1, anchor
    return text.replace(anchor + "\n", anchor + "\n" + lines)


def sub(old: str, new: str, text: str = BASE) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def serving(lines: str) -> str:
    return after("      port: 8000", lines)


def aws(lines: str, text: str = BASE) -> str:
    return after("      weights_uri: s3://acme-models/llama-3.1-70b/", lines, text)


def gcp(lines: str, text: str = BASE) -> str:
    return after("      weights_uri: gs://acme-models/llama-3.1-70b/", lines, text)


def bomb(levels: int = 9, width: int = 9) -> str:
    """A billion-laughs document: width**levels values from a few hundred bytes."""
    out = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        out.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return BASE + "\n".join(out) + "\n"


# (id, config text or bytes, what the one line must contain)
CASES = [
    # --- 3. weights scoping: one parse, each cloud's bucket rules, a plain prefix
    ("s3-wildcard-bucket", sub("s3://acme-models/llama-3.1-70b/", "s3://*/"),
     "pools[0].aws.weights_uri"),
    ("s3-wildcard-prefix", sub("s3://acme-models/llama-3.1-70b/", "s3://acme-models/ll*/"),
     "pools[0].aws.weights_uri"),
    ("s3-question-mark", sub("s3://acme-models/llama-3.1-70b/", "s3://acme-models/ll?ma/"),
     "pools[0].aws.weights_uri"),
    ("s3-policy-variable", sub("s3://acme-models/llama-3.1-70b/",
                               "s3://acme-models/${aws:username}/"), "pools[0].aws.weights_uri"),
    ("s3-dotdot", sub("s3://acme-models/llama-3.1-70b/", "s3://acme-models/a/../../b/"),
     "pools[0].aws.weights_uri"),
    ("s3-uppercase-bucket", sub("s3://acme-models/llama-3.1-70b/", "s3://Acme-Models/x/"),
     "pools[0].aws.weights_uri"),
    ("s3-ip-bucket", sub("s3://acme-models/llama-3.1-70b/", "s3://192.168.10.1/x/"),
     "pools[0].aws.weights_uri"),
    ("s3-gs-scheme", sub("s3://acme-models/llama-3.1-70b/", "gs://acme-models/x/"),
     "pools[0].aws.weights_uri"),
    ("gs-quote-injection", sub("gs://acme-models/llama-3.1-70b/",
                               """'gs://acme-models/x") || true || ("/'"""),
     "pools[0].gcp.weights_uri"),
    ("gs-quote-in-bucket", sub("gs://acme-models/llama-3.1-70b/", """'gs://a"b/x/'"""),
     "pools[0].gcp.weights_uri"),
    ("gs-google-bucket", sub("gs://acme-models/llama-3.1-70b/", "gs://google-models/x/"),
     "pools[0].gcp.weights_uri"),
    ("gs-space", sub("gs://acme-models/llama-3.1-70b/", "'gs://acme-models/a b/'"),
     "pools[0].gcp.weights_uri"),
    # --- 4. secrets: the API key is a reference the nodes resolve
    ("api-key-arn-on-two-clouds", serving(f"      api_key_secret: {AWS_ARN}\n"),
     "pools[0].serving.api_key_secret"),
    ("api-key-not-an-arn", serving("      api_key_secret: {aws: 'hunter2', gcp: vllm-key}\n"),
     "pools[0].serving.api_key_secret.aws"),
    ("api-key-gcp-quote", serving(f"      api_key_secret: {{aws: {AWS_ARN}, gcp: 'a\"b'}}\n"),
     "pools[0].serving.api_key_secret.gcp"),
    ("api-key-gcp-missing", serving(f"      api_key_secret: {{aws: {AWS_ARN}}}\n"),
     "pools[0].serving.api_key_secret.gcp"),
    # --- 6. names and shapes the clouds reject
    ("iam-role-too-long", sub("project: acme\n", "project: " + "a" * 40 + "\n")
     .replace("name: chat-70b", "name: chat-70b-instruct"), "pools[0].name"),
    ("lb-name-internal", sub("project: acme\n", "project: internal\n"), "project"),
    ("gcp-name-starts-with-digit", sub("project: acme\n", "project: 7acme\n"), "project"),
    ("pool-name-uppercase", sub("name: chat-70b", "name: Chat-70B"), "pools[0].name"),
    ("health-path-template",
     serving("""      health_path: '/${trimspace(file("/etc/hostname"))}'\n"""),
     "pools[0].serving.health_path"),
    ("health-path-no-slash", serving("      health_path: health\n"),
     "pools[0].serving.health_path"),
    ("health-path-space", serving("      health_path: '/he alth'\n"),
     "pools[0].serving.health_path"),
    ("health-path-newline", serving('      health_path: "/health\\nX-Injected: 1"\n'),
     "pools[0].serving.health_path"),
    ("vpc-cidr-prefix-33", aws("      network: {vpc_cidr: 10.40.0.0/33}\n"),
     "pools[0].aws.network.vpc_cidr"),
    ("vpc-cidr-host-bits", aws("      network: {vpc_cidr: 10.40.0.1/16}\n"),
     "pools[0].aws.network.vpc_cidr"),
    ("vpc-cidr-too-big", aws("      network: {vpc_cidr: 10.0.0.0/8}\n"),
     "pools[0].aws.network.vpc_cidr"),
    ("client-cidr-garbage", aws("      network: {client_cidrs: ['10.0.0.0/8', 'all']}\n"),
     "pools[0].aws.network.client_cidrs[1]"),
    ("gcp-client-cidr-octet", gcp("      client_cidrs: ['300.0.0.0/8']\n"),
     "pools[0].gcp.client_cidrs[0]"),
    ("image-shell", sub("image: vllm/vllm-openai:v0.11.0", "image: 'vllm/vllm-openai:v1; id'"),
     "pools[0].serving.image"),
    ("image-uppercase", sub("image: vllm/vllm-openai:v0.11.0", "image: vllm/OpenAI:v1"),
     "pools[0].serving.image"),
    ("image-template", sub("image: vllm/vllm-openai:v0.11.0", "image: 'vllm/${var.x}:v1'"),
     "pools[0].serving.image"),
    ("model-id-template", sub("id: meta-llama/Llama-3.1-70B-Instruct",
                              """id: 'm/${file("/etc/passwd")}'"""), "pools[0].model.id"),
    ("model-config-json-device", sub("id: meta-llama/Llama-3.1-70B-Instruct",
                                     "id: acme/x\n      config_json: /dev/stdin"),
     "pools[0].model.config_json: /dev/stdin is not a regular file"),
    ("model-config-json-not-json", sub("id: meta-llama/Llama-3.1-70B-Instruct",
                                       "id: acme/x\n      config_json: poolctl.yaml"),
     "pools[0].model.config_json: poolctl.yaml is not JSON"),
    ("model-unknown-id-no-fields", sub("      params_b: 70.6\n", "").replace(
        "id: meta-llama/Llama-3.1-70B-Instruct", "id: acme/x"), "pools[0].model.id"),
    ("ssm-parameter-template", aws("""      ami_ssm_parameter: '/x/${file("/etc/hostname")}'\n"""),
     "pools[0].aws.ami_ssm_parameter"),
    ("ami-id-garbage", aws("      ami_id: 'ami-12345678; id'\n"), "pools[0].aws.ami_id"),
    ("aws-region-garbage", sub("region: us-east-1", "region: 'us-east-1\"'"),
     "pools[0].aws.region"),
    ("gcp-project-garbage", sub("project: acme-prod", "project: 'Acme Prod'"),
     "pools[0].gcp.project"),
    ("gcp-zone-garbage", gcp("      zones: ['us-central1-a', '*']\n"), "pools[0].gcp.zones[1]"),
    ("subnet-id-garbage", aws("      network: {vpc_id: vpc-0abc, subnet_ids: ['subnet-1 x']}\n"),
     "pools[0].aws.network.subnet_ids[0]"),
    ("gcp-network-path", gcp("      network: '../../networks/x'\n"), "pools[0].gcp.network"),
    ("gcp-subnetwork-other-region",
     gcp("      subnetwork: projects/acme-prod/regions/us-east1/subnetworks/s\n"),
     "pools[0].gcp.subnetwork"),
    ("root-volume-over-16tib", aws("      root_volume_gb: 16385\n"), "pools[0].aws.root_volume_gb"),
    ("max-replicas-unbounded", sub("max_replicas: 24", "max_replicas: 1000000"),
     "pools[0].scaling.max_replicas"),
    ("efa-negative", aws("      efa_interfaces: -1\n"), "pools[0].aws.efa_interfaces"),
    # --- 7. one line, not a crash
    ("params-inf", sub("params_b: 70.6", "params_b: .inf"), "pools[0].model.params_b"),
    ("params-nan", sub("params_b: 70.6", "params_b: .nan"), "pools[0].model.params_b"),
    ("queue-target-neg-inf", sub("queue_target: 4", "queue_target: -.inf"),
     "pools[0].scaling.queue_target"),
    ("max-model-len-huge", sub("max_model_len: 16384", "max_model_len: " + "9" * 400),
     "pools[0].serving.max_model_len"),
    ("int-past-python-limit", sub("max_model_len: 16384", "max_model_len: " + "9" * 5000),
     "pools[0].serving.max_model_len"),
    ("size-float-overflow", serving("      image_size_gb: 1.0e999\n"),
     "pools[0].serving.image_size_gb"),
    ("min-replicas-true", sub("min_replicas: 4", "min_replicas: true"),
     "pools[0].scaling.min_replicas"),
    ("layers-false", sub("layers: 80", "layers: false"), "pools[0].model.layers"),
    ("tp-float", sub("tensor_parallel: 2", "tensor_parallel: 2.0"),
     "pools[0].serving.tensor_parallel"),
    ("checkpoint-bool", sub("checkpoints: [25, 50, 100]", "checkpoints: [25, true, 100]"),
     "pools[0].rollout.checkpoints[1]"),
    ("prepulled-string", serving("      image_prepulled: 'yes'\n"),
     "pools[0].serving.image_prepulled"),
    ("gpudirect-int", gcp("      gpudirect: 1\n"), "pools[0].gcp.gpudirect"),
    ("duplicate-key", serving("      port: 9000\n"), "pools[0].serving.port: key given twice"),
    ("duplicate-pool-key", sub("    slo:\n", "    slo:\n      ttft_p90_s: 1.0\n"),
     "pools[0].slo.ttft_p90_s: key given twice"),
    ("alias-bomb", bomb(), "aliases"),
    ("alias-recursive", BASE + "loop: &loop [1, *loop]\n", "recursive alias"),
    ("nesting-bomb", BASE + "deep: " + "[" * 20000 + "]" * 20000 + "\n", "nested too deeply"),
    ("not-utf8", BASE.encode().replace(b"acme-models/llama", b"acme-models/ll\xffama"),
     "not UTF-8"),
    ("latin1", BASE.replace("Instruct", "Instruct ©").encode("latin-1"), "not UTF-8"),
    ("python-tag", BASE + "x: !!python/object/apply:os.system ['id']\n", "not valid YAML"),
    ("nul-byte", BASE + "x: \x00\n", "not valid YAML"),
    # --- issue 23: never a traceback, nothing accepted that the cloud or the engine refuses
    ("tp-zero", sub("tensor_parallel: 2", "tensor_parallel: 0"),
     "pools[0].serving.tensor_parallel: must be 1 or more; got 0"),
    ("tp-negative", sub("tensor_parallel: 2", "tensor_parallel: -2"),
     "pools[0].serving.tensor_parallel"),
    ("tp-past-the-node", sub("tensor_parallel: 2", "tensor_parallel: 16"),
     "pools[0].serving.tensor_parallel: must be 8 or less"),
    ("complex-key-top", BASE + "? [a, b]\n: c\n", "(top): a key is a list"),
    ("complex-key-inside", sub("    slo:\n", "    slo:\n      ? [a, b]\n      : c\n"),
     "pools[0].slo: a key is a list"),
    ("complex-key-mapping", sub("    slo:\n", "    slo:\n      ? {a: 1}\n      : c\n"),
     "pools[0].slo: a key is a mapping"),
    ("complex-key-flow", sub("    slo:\n", "    slo: {[a]: 1}\n    x:\n"),
     "pools[0].slo: a key is a list"),
    ("merge-key-twice", sub("    serving:\n", "    serving:\n      <<: {max_num_seqs: 64}\n"
                                              "      <<: {max_num_seqs: 128}\n"),
     "pools[0].serving.<<: merge key given twice"),
    ("config-json-name-too-long", sub("      params_b: 70.6\n", "      config_json: "
                                      + "a" * 300 + ".json\n"),
     "pools[0].model.config_json: " + "a" * 97 + "... cannot be read (File name too long)"),
    ("config-json-nul", sub("      params_b: 70.6\n", '      config_json: "c\\0.json"\n'),
     "pools[0].model.config_json: holds U+0000"),
    ("backend-s3-expression", BASE + "backend:\n  aws: {bucket: '${var.x}', region: us-east-1}\n",
     "backend.aws.bucket: Terraform takes no expressions in a backend block"),
    ("backend-s3-file", BASE + "backend:\n  aws: {bucket: acme-state, region: 'file(\"r\")'}\n",
     "backend.aws.region: Terraform takes no expressions"),
    ("backend-s3-quote", BASE + "backend:\n  aws: {bucket: 'acme\"state', region: us-east-1}\n",
     "backend.aws.bucket"),
    ("backend-s3-no-region", BASE + "backend:\n  aws: {bucket: acme-state, region: xx-east-1}\n",
     "backend.aws.region: not an AWS region"),
    ("backend-s3-key-quote",
     BASE + "backend:\n  aws: {bucket: acme-state, region: us-east-1, key_prefix: 'a\"b'}\n",
     "backend.aws.key_prefix"),
    ("backend-dynamodb-expression", BASE + "backend:\n  aws: {bucket: acme-state, region: "
     "us-east-1, dynamodb_table: '${var.t}'}\n", "backend.aws.dynamodb_table: Terraform"),
    ("backend-gcs-expression", BASE + "backend:\n  gcp: {bucket: '${var.b}'}\n",
     "backend.gcp.bucket: Terraform takes no expressions"),
    ("backend-gcs-google", BASE + "backend:\n  gcp: {bucket: google-state}\n",
     "backend.gcp.bucket"),
    ("backend-gcs-prefix", BASE + "backend:\n  gcp: {bucket: acme-state, prefix: '/x/'}\n",
     "backend.gcp.prefix"),
    ("certificate-arn-template", aws("      certificate_arn: 'arn:aws:acm:us-east-1:1:${x}'\n"),
     "pools[0].aws.certificate_arn: not an ACM certificate ARN"),
    ("certificate-arn-quote", aws("      certificate_arn: 'arn:aws:acm:us-east-1:123456789012:"
                                  "certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789\"'\n"),
     "pools[0].aws.certificate_arn: not an ACM certificate ARN"),
    ("certificate-arn-other-region",
     aws("      certificate_arn: arn:aws:acm:eu-west-1:123456789012:certificate/"
         "0a1b2c3d-4e5f-6789-abcd-ef0123456789\n"),
     "pools[0].aws.certificate_arn: is in eu-west-1, the pool in us-east-1"),
    ("alarm-topic-template", aws("      alarm_topic_arn: 'arn:aws:sns:us-east-1:1:${x}'\n"),
     "pools[0].aws.alarm_topic_arn: not an SNS topic ARN"),
    ("alarm-topic-other-region",
     aws("      alarm_topic_arn: arn:aws:sns:eu-west-1:123456789012:pool-alarms\n"),
     "pools[0].aws.alarm_topic_arn: is in eu-west-1, the pool in us-east-1"),
    ("alarm-after-not-minutes", sub("      ttft_p90_s: 2.0\n",
                                    "      ttft_p90_s: 2.0\n      alarm_after_s: 90\n"),
     "pools[0].slo.alarm_after_s"),
    ("gcp-image-template", gcp("      image: 'projects/x/${var.i}'\n"),
     "pools[0].gcp.image: not a Compute Engine image"),
    ("gcp-image-space", gcp("      image: 'my image'\n"), "pools[0].gcp.image"),
    ("gcp-channel-shape", gcp("      alert_notification_channel: projects/acme-prod/channels/1\n"),
     "pools[0].gcp.alert_notification_channel: not a notification channel like "
     "projects/my-project/notificationChannels/1234567890"),
    ("gcp-channel-project", gcp(
        "      alert_notification_channel: projects/other-proj/notificationChannels/42\n"),
     "pools[0].gcp.alert_notification_channel: is in project other-proj, the pool in "),
    ("gcp-base-image-quote", gcp("      base_image: 'family/x\"'\n"), "pools[0].gcp.base_image"),
    ("gcp-base-image-other-form", gcp("      base_image: debian-cloud/debian-12\n"),
     "pools[0].gcp.base_image"),
    ("aws-builder-type-quote", aws("      image_builder_type: 'm6i.xlarge\"'\n"),
     "pools[0].aws.image_builder_type: not an EC2 instance type"),
    ("gcp-builder-type-template", gcp("      image_builder_type: '${var.t}'\n"),
     "pools[0].gcp.image_builder_type: not a machine type"),
    ("instance-type-space", sub("instance_type: p5.48xlarge", "instance_type: 'p5 48xlarge'"),
     "pools[0].aws.instance_type"),
    ("version-nul", sub("      params_b: 70.6\n", '      version: "v1\\0"\n      params_b: 70.6\n'),
     "pools[0].model.version: holds U+0000"),
    ("version-ansi", sub("      params_b: 70.6\n",
                         '      version: "\\e[31mv1\\e[0m"\n      params_b: 70.6\n'),
     "pools[0].model.version: holds U+001B"),
    ("version-bidi", sub("      params_b: 70.6\n",
                         '      version: "v1\\u202e2v"\n      params_b: 70.6\n'),
     "pools[0].model.version: holds U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("version-newline",
     sub("      params_b: 70.6\n", '      version: "v1\\nv2"\n      params_b: 70.6\n'),
     "pools[0].model.version: holds U+000A"),
    ("extra-arg-bidi", serving('      extra_args: ["--served-model-name", "chat\\u2066x"]\n'),
     "pools[0].serving.extra_args[1]: holds U+2066"),
    ("min-replicas-zero", sub("min_replicas: 4", "min_replicas: 0"),
     "pools[0].scaling.min_replicas: 0 leaves no node to publish the queue metric"),
    ("subnets-without-vpc", aws("      network: {subnet_ids: [subnet-0abc, subnet-0def]}\n"),
     "pools[0].aws.network.subnet_ids: given without aws.network.vpc_id"),
    ("vpc-without-subnets", aws("      network: {vpc_id: vpc-0abc}\n"),
     "pools[0].aws.network.subnet_ids: aws.network.vpc_id vpc-0abc needs subnet_ids"),
    ("vpc-with-created-vpc-keys", aws("      network: {vpc_id: vpc-0abc, subnet_ids: "
                                      "[subnet-0abc, subnet-0def], vpc_cidr: 10.1.0.0/16}\n"),
     "pools[0].aws.network.vpc_cidr: shapes the VPC poolctl creates"),
    ("max-num-seqs-huge", serving("      max_num_seqs: 1000000000000000000000\n"),
     "pools[0].serving.max_num_seqs: must be 65536 or less"),
    ("step-overhead-huge", BASE.replace("    slo:\n", "    perf:\n      step_overhead_ms: "
                                        "1.0e+308\n    slo:\n"),
     "pools[0].perf.step_overhead_ms: must be 1000 or less"),
    ("decode-ms-inf", BASE.replace("    slo:\n", "    perf:\n      decode_ms_batch1: 20.0\n"
                                   "      decode_ms_batch64: .inf\n    slo:\n"),
     "pools[0].perf.decode_ms_batch64: must be a finite number"),
    ("utilization-one", sub("target_utilization: 0.6", "target_utilization: 1.0"),
     "pools[0].slo.target_utilization: must be less than 1"),
    ("checkpoint-huge",
     sub("checkpoints: [25, 50, 100]", "checkpoints: [25, 50, 1" + "0" * 40 + "]"),
     "pools[0].rollout.checkpoints[2]: must be 100 or less"),
    # An old file's `hibernated`: an unknown value like any other (the contract: stopped |
    # running).
    ("warm-hibernated", sub("state: stopped", "state: hibernated"),
     "pools[0].warm_pool.state: must be one of 'stopped' or 'running'; got 'hibernated'"),
    ("aws-region-other-digits", sub("region: us-east-1", "region: us-east-\u0661"),
     "pools[0].aws.region: not an AWS region"),
    ("gcp-region-other-digits", sub("region: us-central1", "region: us-central\u0661"),
     "pools[0].gcp.region: not a GCP region"),
    ("unknown-key-newline", serving('      "po\\nrt": 1\n'),
     "pools[0].serving['po\\nrt']: unknown key"),
]


def run(argv: list[str], monkeypatch, capsys) -> tuple[int | str | None, str, str]:
    """`poolctl ARGV` in this process, as the console script runs it."""
    monkeypatch.setattr(sys, "argv", ["poolctl", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working folder, and no POOLCTL_* leaking in from the caller."""
    for name in ("POOLCTL_FILE", "POOLCTL_HOME", "POOLCTL_POLL_S", "POOLCTL_SANDBOX_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(folder: Path, content: str | bytes) -> Path:
    f = folder / "poolctl.yaml"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    return f


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("content", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", ["validate", "synth"])
def test_hostile_config_is_one_line_exit_2(command, content, expect, workdir, monkeypatch,
                                           capsys):
    f = _write(workdir, content)
    before = sorted(p.name for p in workdir.iterdir())
    code, out, err = run([command, "-f", str(f)], monkeypatch, capsys)
    assert code == 2, err
    line = _one_line(err)
    assert line.startswith("poolctl: poolctl.yaml") or line.startswith(f"poolctl: {f}"), line
    assert expect in line, line
    assert out == ""
    assert sorted(p.name for p in workdir.iterdir()) == before  # no cdktf.out, no home


def test_there_are_enough_cases():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_the_base_config_is_accepted(workdir, monkeypatch, capsys):
    """The cases fail for their defect alone: the text they start from validates."""
    f = _write(workdir, BASE)
    code, _, err = run(["validate", "-f", str(f)], monkeypatch, capsys)
    assert code == 0, err


def test_messages_do_not_echo_huge_values(workdir, monkeypatch, capsys):
    f = _write(workdir, sub("max_model_len: 16384", "max_model_len: " + "9" * 5000))
    _, _, err = run(["validate", "-f", str(f)], monkeypatch, capsys)
    assert len(err) < 400


def test_alias_budget_admits_ordinary_sharing(workdir, monkeypatch, capsys):
    """Anchors that share a block between two pools are fine; only expansion is bounded."""
    text = BASE.replace("    model:\n", "    model: &llama\n", 1)
    pool = text.split("pools:\n", 1)[1]
    second = pool.replace("name: chat-70b", "name: chat-70b-b").split("    model: &llama\n")
    rest = second[1].split("    serving:\n", 1)[1]
    text += second[0] + "    model: *llama\n    serving:\n" + rest
    code, _, err = run(["validate", "-f", str(_write(workdir, text))], monkeypatch, capsys)
    assert code == 0, err


# ------------------------------------------------------------------ rule-level refusals

RULE_CASES = [  # (id, text, cloud, key)
    ("api-key-flag", serving('      extra_args: ["--api-key", "abc123"]\n'), "aws",
     "pools[0].serving.extra_args[0]"),
    ("hf-token-value", serving('      extra_args: ["--x", "hf_' + "Ab1" * 12 + '"]\n'), "gcp",
     "pools[0].serving.extra_args[1]"),
    ("aws-key-value", serving('      extra_args: ["--creds=AKIA' + "ABCDEFGHIJKLMNOP" + '"]\n'),
     "aws", "pools[0].serving.extra_args[0]"),
    ("warm-beyond-max", sub("      replicas: 8\n", "      replicas: 10000\n")
     .replace("max_replicas: 24", "max_replicas: 32"), "aws", "pools[0].warm_pool.replicas"),
    ("batched-tokens-below-seqs", sub("max_num_batched_tokens: 8192", "max_num_batched_tokens: 1"),
     "gcp", "pools[0].serving.max_num_batched_tokens"),
    ("gcp-startup-script-over-256k",
     serving('      extra_args: ["--x=' + "y" * 270_000 + '"]\n'), "gcp",
     "pools[0].serving.extra_args"),
    # A good fallback type beside a warm pool: the pool's design, not its input (exit 1).
    ("fallback-beside-warm-pool", gcp("      fallback_machine_types: [a3-megagpu-8g]\n"),
     "gcp", "pools[0].gcp.fallback_machine_types"),
]


@pytest.mark.parametrize(("content", "cloud", "expect"), [c[1:] for c in RULE_CASES],
                         ids=[c[0] for c in RULE_CASES])
def test_rule_refusals_name_the_key_and_write_nothing(content, cloud, expect, workdir,
                                                      monkeypatch, capsys):
    """A failed rule: exit 1, one `error:` line naming the key, and synth writes nothing."""
    f = _write(workdir, content)
    for command in ("validate", "synth"):
        code, _, err = run([command, "-f", str(f), "--cloud", cloud], monkeypatch, capsys)
        assert code == 1, err
        # each finding starts with FILE:LINE of its key, then its severity
        errors = [x for x in err.splitlines() if x.startswith(f"{f}:") and ": error: " in x]
        assert len(errors) == 1 and expect in errors[0], err
        assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["poolctl.yaml"]


# A fallback type that can never serve the pool is bad input (issue 21): exit 2, one error
# line naming the list item, nothing written. No warm pool, so that is the only finding.
NO_WARM = sub("      replicas: 8\n", "      replicas: 0\n")
FALLBACK_CASES = [  # (id, text, cloud, key, says)
    ("aws-no-nvlink", aws("      fallback_instance_types: [g5.48xlarge]\n", NO_WARM), "aws",
     "pools[0].aws.fallback_instance_types[0]", "without NVLink"),
    ("aws-not-in-catalog", aws("      fallback_instance_types: [p5en.48xlarge, p9.48xlarge]\n",
                               NO_WARM), "aws",
     "pools[0].aws.fallback_instance_types[1]", "not in the catalog"),
    # A100 40 GB: 39.5 GB usable per GPU < the 75.4 GB a TP 2 replica of Llama 70B needs.
    ("aws-cannot-hold", aws("      fallback_instance_types: [p4d.24xlarge]\n", NO_WARM), "aws",
     "pools[0].aws.fallback_instance_types[0]", "cannot hold the model"),
    ("gcp-no-nvlink", gcp("      fallback_machine_types: [g2-standard-96]\n", NO_WARM), "gcp",
     "pools[0].gcp.fallback_machine_types[0]", "without NVLink"),
    ("gcp-cannot-hold", gcp("      fallback_machine_types: [a2-highgpu-8g]\n", NO_WARM), "gcp",
     "pools[0].gcp.fallback_machine_types[0]", "cannot hold the model"),
    # a3-ultragpu-8g bundles 32 Local SSDs; a3-highgpu-8g's template attaches 16.
    ("gcp-local-ssd", gcp("      fallback_machine_types: [a3-ultragpu-8g]\n", NO_WARM), "gcp",
     "pools[0].gcp.fallback_machine_types[0]", "32 Local SSD(s) (bundled)"),
]


@pytest.mark.parametrize(("content", "cloud", "key", "says"), [c[1:] for c in FALLBACK_CASES],
                         ids=[c[0] for c in FALLBACK_CASES])
def test_a_fallback_type_that_cannot_serve_is_bad_input_exit_2(content, cloud, key, says,
                                                              workdir, monkeypatch, capsys):
    f = _write(workdir, content)
    for command in ("validate", "synth"):
        code, _, err = run([command, "-f", str(f), "--cloud", cloud], monkeypatch, capsys)
        assert code == 2, err
        errors = [x for x in err.splitlines() if ": error: " in x]
        assert len(errors) == 1 and f" {key}: " in errors[0] and says in errors[0], err
        assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["poolctl.yaml"]


# ------------------------------------------------------------- the environment, --out

ENV_CASES = [
    ("POOLCTL_POLL_S", "soon"),
    ("POOLCTL_POLL_S", "-1"),
    ("POOLCTL_POLL_S", "nan"),
    ("POOLCTL_SANDBOX_PORT", "99999"),
    ("POOLCTL_SANDBOX_QUOTAS", "{not json"),
    ("POOLCTL_SANDBOX_QUOTAS", '{"L-417A185B": "lots"}'),
    ("POOLCTL_TERRAFORM", "/nonexistent/terraform"),
    ("POOLCTL_PROVIDER_MIRROR", "/nonexistent/mirror"),
    ("POOLCTL_GCE_ENDPOINT", "file:///etc/passwd"),
    ("POOLCTL_QUOTA_CONTACT_EMAIL", "nobody"),
]


@pytest.mark.parametrize(("name", "value"), ENV_CASES, ids=[f"{n}={v}" for n, v in ENV_CASES])
def test_bad_environment_stops_before_anything(name, value, workdir, monkeypatch, capsys):
    f = _write(workdir, BASE)
    monkeypatch.setenv(name, value)
    code, _, err = run(["synth", "-f", str(f)], monkeypatch, capsys)
    assert code == 2
    assert _one_line(err).startswith(f"poolctl: {name}=")
    assert sorted(p.name for p in workdir.iterdir()) == ["poolctl.yaml"]


def test_home_that_is_a_file(workdir, monkeypatch, capsys):
    (workdir / "home-file").write_text("")
    monkeypatch.setenv("POOLCTL_HOME", str(workdir / "home-file"))
    code, _, err = run(["validate", "-f", str(_write(workdir, BASE))], monkeypatch, capsys)
    assert code == 2 and "POOLCTL_HOME=" in _one_line(err)


@pytest.mark.parametrize("out", ["afile", "afile/sub"])
def test_out_naming_a_file(out, workdir, monkeypatch, capsys):
    (workdir / "afile").write_text("keep me\n")
    code, _, err = run(["synth", "-f", str(_write(workdir, BASE)), "--out", out],
                       monkeypatch, capsys)
    assert code == 2
    assert _one_line(err).startswith("poolctl: --out: afile is a file")
    assert (workdir / "afile").read_text() == "keep me\n"


def test_rollout_image_uses_the_config_grammar(workdir, monkeypatch, capsys):
    f = _write(workdir, BASE)
    code, _, err = run(["rollout", "start", "--cloud", "aws", "-f", str(f), "--image",
                        "vllm/vllm-openai:v1;reboot", "--no-wait"], monkeypatch, capsys)
    assert code == 2 and _one_line(err).startswith("poolctl: --image: not an image reference")
    assert f.read_text() == BASE  # the file is not edited


# ------------------------------------------------------------------ as a real process

@pytest.mark.parametrize("case", ["s3-wildcard-bucket", "gs-quote-injection", "alias-bomb",
                                  "not-utf8", "params-inf", "duplicate-key",
                                  "int-past-python-limit", "min-replicas-true"])
def test_subprocess_one_line_no_traceback(case, tmp_path):
    content, expect = next(c[1:] for c in CASES if c[0] == case)
    f = _write(tmp_path, content)
    r = subprocess.run([sys.executable, "-m", "poolctl", "synth", "-f", str(f)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert expect in _one_line(r.stderr)
    assert not (tmp_path / "cdktf.out").exists()


# --------------------------------------------- the longest accepted names, synthesized

@pytest.mark.synth
def test_longest_accepted_names_fit_every_cloud_name(tmp_path):
    """Project + pool at the AWS limit (55 characters): every name in both synthesized
    stacks meets its cloud's rules (IAM roles <= 64, ALB/target group <= 32 and not
    `internal-`, GCP resource names RFC 1035 <= 63)."""
    import re

    from poolctl.config import parse_config
    from poolctl.naming import MAX_BASE_AWS
    from poolctl_stacks.app import synth

    project = "p" + "r" * 39
    pool = "x" * (MAX_BASE_AWS - len(project) - 1)
    cfg = parse_config(sub("project: acme\n", f"project: {project}\n")
                       .replace("name: chat-70b", f"name: {pool}"))
    too_long = sub("project: acme\n", f"project: {project}\n").replace(
        "name: chat-70b", f"name: {pool}x")
    with pytest.raises(Exception, match=r"pools\[0\]\.name: .* over AWS's 64"):
        parse_config(too_long)
    dirs = synth([(cfg, cfg.targets(None, None))], tmp_path)
    docs = {d.name: json.loads((d / "cdk.tf.json").read_text()) for d in dirs}
    rfc1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    checked = 0
    for doc in docs.values():
        for rtype, items in doc.get("resource", {}).items():
            for body in items.values():
                name = body.get("name")
                if not isinstance(name, str) or "${" in name:
                    continue
                checked += 1
                if rtype in ("aws_iam_role", "aws_iam_instance_profile"):
                    assert len(name) <= 64, (rtype, name)
                if rtype in ("aws_lb", "aws_lb_target_group"):
                    assert len(name) <= 32 and not name.startswith("internal-"), (rtype, name)
                if rtype.startswith("google_compute_"):
                    assert rfc1035.match(name), (rtype, name)
                if rtype == "google_compute_instance_template":
                    raise AssertionError("templates use name_prefix")
            for body in items.values():
                prefix = body.get("name_prefix")
                if rtype.startswith("google_compute_") and isinstance(prefix, str):
                    assert len(prefix) <= 37 and rfc1035.match(prefix + "x"), prefix
    assert checked >= 15, docs.keys()


# ------------------------------------------------ -f naming what is not a config file (23)

@pytest.mark.parametrize(("kind", "expect"), [
    ("folder", "is a folder; pass the config file in it"),
    ("fifo", "is not a regular file (a FIFO)"),
    ("dev-zero", "is not a regular file (a character device)"),
    ("missing", "not found"),
])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_file_that_is_not_a_regular_file(kind, expect, how, workdir, monkeypatch, capsys):
    """Said as what it is, never read: a FIFO would block and /dev/zero never ends."""
    import os

    target = {"folder": workdir / "conf", "fifo": workdir / "pipe",
              "dev-zero": Path("/dev/zero"), "missing": workdir / "nope.yaml"}[kind]
    if kind == "folder":
        target.mkdir()
    if kind == "fifo":
        os.mkfifo(target)
    if how == "env":
        monkeypatch.setenv("POOLCTL_FILE", str(target))
        argv = ["validate"]
    else:
        argv = ["validate", "-f", str(target)]
    code, out, err = run(argv, monkeypatch, capsys)
    assert code == 2, err
    flag = "POOLCTL_FILE" if how == "env" else "-f/--file"
    assert _one_line(err).startswith(f"poolctl: {flag}: {target} {expect}"), err
    assert out == ""


def test_file_name_with_a_newline_stays_one_line(workdir, monkeypatch, capsys):
    code, _, err = run(["validate", "-f", str(workdir / "a\nb.yaml")], monkeypatch, capsys)
    assert code == 2 and "not found" in _one_line(err) and "\\n" in err


def test_file_over_the_size_cap(workdir, monkeypatch, capsys):
    from poolctl.config import MAX_FILE_BYTES

    f = _write(workdir, BASE + "#" * MAX_FILE_BYTES + "\n")
    code, _, err = run(["validate", "-f", str(f)], monkeypatch, capsys)
    assert code == 2 and "over 4 MiB, too large for a pool config" in _one_line(err)


@pytest.mark.parametrize(("body", "expect"), [
    ('{"num_hidden_layers": 1' + "0" * 200 + ', "hidden_size": 4096, "vocab_size": 1000, '
     '"num_attention_heads": 32, "intermediate_size": 100}',
     "c.json: num_hidden_layers is an integer of over 30 digits, past any model's"),
    ('{"num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 3' + "0" * 199 + ', '
     '"num_attention_heads": 32, "intermediate_size": 100}', "c.json: vocab_size is"),
    ('{"num_hidden_layers": 4294967296}', "c.json: num_hidden_layers is 4294967296, past any"),
])
def test_config_json_with_huge_integers(body, expect, workdir, monkeypatch, capsys):
    """Integers of 200 digits overflowed the params_b estimate (OverflowError)."""
    (workdir / "c.json").write_text(body)
    text = sub("      params_b: 70.6\n", "      config_json: c.json\n").replace(
        "meta-llama/Llama-3.1-70B-Instruct", "acme/own")
    code, _, err = run(["validate", "-f", str(_write(workdir, text))], monkeypatch, capsys)
    assert code == 2, err
    assert f"pools[0].model.config_json: {expect}" in _one_line(err)
