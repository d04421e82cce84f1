"""The rendered node start-up script (poolctl.bootscript + cli/poolctl/boot/*.sh.j2).

Golden files live in tests/golden/boot/. After an intended template change, regenerate them
and review the diff:

    POOLCTL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_bootscript.py

shellcheck comes from apt (`apt-get install -y shellcheck`); without it those tests skip and
say so. The scripts' behaviour (fakes for docker, aws, gcloud, IMDS) is in
test_boot_runtime.py; the NVMe step on real loop devices in tests/ops/test_nvme_raid.py.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

from poolctl import bootscript, naming
from poolctl.bootscript import render_boot_script, render_nvme_script
from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.errors import OperationFailed, UsageError
from poolctl.rules import refuse_invalid
from tests.plugins.golden import assert_golden
from tests.synth.util import checkov_bin

from .boot_config import EXTRA_ARGS, config_yaml, load

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "boot"
AWS_SECRET_ARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:vllm-key-AbCdEf"
GCP_SECRET = "vllm-key"


@pytest.fixture(scope="module")
def cfg():
    return load()


@pytest.fixture(scope="module")
def aws_script(cfg):
    return render_boot_script(cfg, cfg.pools[0], "aws")


@pytest.fixture(scope="module")
def gcp_script(cfg):
    return render_boot_script(cfg, cfg.pools[1], Cloud.gcp)


def _all_scripts(cfg) -> dict[str, str]:
    ecr = load(image="123456789012.dkr.ecr.us-east-1.amazonaws.com/serving/vllm:v0.11.0")
    aws_key, gcp_key = load(api_key_secret=AWS_SECRET_ARN), load(api_key_secret=GCP_SECRET)
    cc = load(compile_cache=True)
    stream = load(stream=True)
    return {
        "aws-chat-70b-stream.sh": render_boot_script(stream, stream.pools[0], Cloud.aws),
        "aws-chat-70b-stream-image.sh": render_boot_script(stream, stream.pools[0], Cloud.aws,
                                                           from_image=True),
        "aws-chat-70b-compile-cache.sh": render_boot_script(cc, cc.pools[0], Cloud.aws),
        "gcp-llama-405b-compile-cache.sh": render_boot_script(cc, cc.pools[1], Cloud.gcp),
        "aws-chat-70b.sh": render_boot_script(cfg, cfg.pools[0], Cloud.aws),
        "gcp-llama-405b.sh": render_boot_script(cfg, cfg.pools[1], Cloud.gcp),
        "aws-chat-70b-ecr.sh": render_boot_script(ecr, ecr.pools[0], Cloud.aws),
        "aws-chat-70b-api-key.sh": render_boot_script(aws_key, aws_key.pools[0], Cloud.aws),
        "gcp-llama-405b-api-key.sh": render_boot_script(gcp_key, gcp_key.pools[1], Cloud.gcp),
        "nvme-raid-aws.sh": render_nvme_script(Cloud.aws, 8),
        "nvme-raid-gcp.sh": render_nvme_script(Cloud.gcp, 16),
        # On a node image that carries the boot library: the pool's parts only.
        "aws-chat-70b-image.sh": render_boot_script(cfg, cfg.pools[0], Cloud.aws, from_image=True),
        "gcp-llama-405b-image.sh": render_boot_script(cfg, cfg.pools[1], Cloud.gcp,
                                                      from_image=True),
        "gcp-llama-405b-api-key-image.sh": render_boot_script(gcp_key, gcp_key.pools[1], Cloud.gcp,
                                                              from_image=True),
        "boot-lib-aws.sh": bootscript.boot_library("aws")["text"],
        "boot-lib-gcp.sh": bootscript.boot_library("gcp")["text"],
    }


# --- golden files -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["aws-chat-70b.sh", "gcp-llama-405b.sh", "nvme-raid-aws.sh",
                                  "aws-chat-70b-image.sh", "gcp-llama-405b-image.sh"])
def test_matches_golden(cfg, name):
    text = _all_scripts(cfg)[name]
    assert_golden(GOLDEN / name, text)


# --- key content ----------------------------------------------------------------------------

def test_one_endpoint_per_node_with_data_parallel(aws_script, gcp_script):
    # p5.48xlarge: 8 GPUs / tensor_parallel 2 = 4 replicas; a3-highgpu-8g: 8 / 8 = 1.
    assert "--tensor-parallel-size 2 --data-parallel-size 4" in aws_script
    assert "REPLICAS_PER_NODE=4\n" in aws_script
    assert "--tensor-parallel-size 8 --data-parallel-size 1" in gcp_script
    assert "REPLICAS_PER_NODE=1\n" in gcp_script


def test_serving_flags(aws_script):
    for flag in ("--gpus all", "--ipc=host", "--restart on-failure", '-v "$CACHE:$CACHE:ro"',
                 '--model "$WEIGHTS_DIR"', '--served-model-name "$MODEL_ID"',
                 "--max-model-len 16384", "--gpu-memory-utilization 0.92",
                 "--enable-chunked-prefill", "--max-num-batched-tokens 8192", '--port "$PORT"',
                 '"${EXTRA_ARGS[@]}"'):
        assert flag in aws_script, flag
    assert "MODEL_ID=meta-llama/Llama-3.1-70B-Instruct\n" in aws_script
    assert 'WEIGHTS_DIR="$CACHE/weights/"meta-llama_Llama-3.1-70B-Instruct/2024-07\n' in aws_script
    assert "PORT=8000\n" in aws_script


def test_prefix_caching_off_is_passed_to_vllm(cfg, aws_script):
    """vLLM V1 caches prefixes by default: poolctl says nothing unless the file turns it
    off, and then passes --no-enable-prefix-caching."""
    assert "prefix-caching" not in aws_script
    pool = cfg.pools[0].model_copy(update={"serving": cfg.pools[0].serving.model_copy(
        update={"prefix_caching": False})})
    assert "--no-enable-prefix-caching" in render_boot_script(cfg, pool, Cloud.aws)


def test_extra_args_survive_the_shell_unchanged(aws_script):
    line = next(ln for ln in aws_script.splitlines() if ln.startswith("EXTRA_ARGS=("))
    out = subprocess.run(["bash", "-c", line + '\nprintf "%s\\0" "${EXTRA_ARGS[@]}"'],
                         capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split("\0")[:-1] == EXTRA_ARGS
    assert not Path("/tmp/poolctl-pwned").exists()


def test_lifecycle_hook_only_on_aws(aws_script, gcp_script):
    assert "aws autoscaling \"$1\" --auto-scaling-group-name \"$POOL\"" in aws_script
    assert "complete-lifecycle-action --lifecycle-action-result" in aws_script
    assert f"LIFECYCLE_HOOK={naming.LIFECYCLE_HOOK}\n" in aws_script
    # The ASG is named naming.base(cfg, pool).
    assert "POOL=acme-chat-70b\n" in aws_script
    assert "lifecycle ABANDON" in aws_script
    for word in ("autoscaling", "lifecycle", "aws ", "IMDS"):
        assert word not in gcp_script, word


def test_serving_container_is_cut_off_from_node_credentials(aws_script, gcp_script):
    """Bridge network with the port published (no host network: the IMDS hop limit would
    not apply), and a DOCKER-USER rule dropping containers' traffic to the metadata
    address, inserted before the container starts."""
    for script in (aws_script, gcp_script):
        cmds = [c.strip() for c in _commands(script)]
        run = next(c for c in cmds if c.startswith("docker run -d"))
        assert "--network host" not in script and "--net=host" not in script
        assert '--network bridge -p "$PORT:$PORT"' in run and "--ipc=host" in run
        assert '--env-file "$env_file"' in run
        body = script[script.index("start_serving() {"):]
        assert body.index("  block_metadata\n") < body.index("docker run -d")
        assert "iptables -I DOCKER-USER -d 169.254.169.254/32 -j DROP" in cmds


def test_api_key_secret_is_named_never_held(cfg):
    scripts = _all_scripts(cfg)
    aws_key, gcp_key = scripts["aws-chat-70b-api-key.sh"], scripts["gcp-llama-405b-api-key.sh"]
    assert f"API_KEY_SECRET={AWS_SECRET_ARN}\n" in aws_key
    # The ARN's region, not the pool's: a secret may live in another region.
    assert "get-secret-value --region us-west-2 \\" in aws_key
    assert "API_KEY_SECRET=projects/acme-prod/secrets/vllm-key\n" in gcp_key
    assert 'gcloud secrets versions access "$API_KEY_SECRET/versions/latest"' in gcp_key
    for script in (aws_key, gcp_key):
        assert "--api-key" not in script and "VLLM_API_KEY=%s" in script
    for script in (scripts["aws-chat-70b.sh"], scripts["gcp-llama-405b.sh"]):
        assert "API_KEY_SECRET" not in script and "write_api_key" not in script


def test_queue_metric_names(aws_script, gcp_script):
    assert f"METRIC_NAMESPACE={naming.METRIC_NAMESPACE}\n" in aws_script
    assert f"METRIC_NAME={naming.METRIC_NAME}\n" in aws_script
    assert '--metric-data "file://$STATE/metric-data.json"' in aws_script
    for name in (naming.TTFT_METRIC, naming.TPOT_METRIC, naming.E2E_METRIC,
                 naming.REQUESTS_METRIC, naming.PROMPT_TOKENS_METRIC,
                 naming.OUTPUT_TOKENS_METRIC, naming.RUNNING_METRIC, naming.KV_USAGE_METRIC):
        assert f'"{name}"' in aws_script, name  # what status reads, as the agent names it
    assert f"METRIC_TYPE={naming.GCP_METRIC_TYPE}\n" in gcp_script
    assert "OnUnitActiveSec=15\n" in aws_script and "OnUnitActiveSec=15\n" in gcp_script


def _commands(script: str) -> list[str]:
    """Logical lines: continuation lines joined."""
    return script.replace("\\\n", " ").splitlines()


def test_imds_v2_only(aws_script):
    cmds = [c for c in _commands(aws_script) if "$IMDS" in c or "169.254.169.254" in c]
    literal = [c for c in cmds
               if "169.254.169.254" in c and not c.strip().startswith("iptables ")]
    # The address appears once, in the variable every call goes through (and in the
    # firewall rule that keeps containers away from it).
    assert literal == ["IMDS=${POOLCTL_IMDS_URL:-http://169.254.169.254/latest}"]
    calls = [c for c in cmds if "curl" in c]
    assert len(calls) == 2, calls
    put, get = calls
    assert "-X PUT" in put and "X-aws-ec2-metadata-token-ttl-seconds:" in put
    assert '"$IMDS/api/token"' in put
    assert '-H "X-aws-ec2-metadata-token: $token"' in get
    # Nothing else reaches the metadata service but through imds().
    other = [c for c in cmds if "curl" not in c and not c.startswith("IMDS=")
             and not c.strip().startswith("iptables ")]
    assert other == [], other


def test_no_secrets_in_user_data(cfg, monkeypatch, tmp_path):
    canary = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYcanary0000"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7CANARY0")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/canary/key.json")
    scripts = {**_all_scripts(cfg), "aws-env.sh": render_boot_script(cfg, cfg.pools[0], "aws")}
    pattern = re.compile(
        r"AKIA[0-9A-Z]{16}|aws_secret_access_key|AWS_SECRET|AWS_SESSION_TOKEN|PRIVATE KEY|"
        r"ya29\.|canary|private_key|--password[ =](?!-stdin)",
        re.IGNORECASE,
    )
    # The one place names of credentials are written: the format of the streamed weights'
    # credentials file (aws.weights_load: stream), placeholders only; the values come from
    # STS at boot.
    env_file = ("printf '[default]\\naws_access_key_id = %s\\naws_secret_access_key = %s"
                "\\naws_session_token = %s\\n'")
    assert env_file in scripts["aws-chat-70b-stream.sh"]
    for name, text in scripts.items():
        text = text.replace(env_file, "")
        assert not pattern.search(text), (name, pattern.search(text))
    # A second opinion from a real scanner: Yelp's detect-secrets, a checkov dependency, so
    # it sits beside the checkov scripts/setup installs.
    scanner = Path(checkov_bin()).with_name("detect-secrets")
    assert scanner.is_file(), f"no {scanner}: run scripts/setup (checkov brings detect-secrets)"
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
    report = subprocess.run([str(scanner), "scan", *scripts], cwd=tmp_path, capture_output=True,
                            check=True)
    assert json.loads(report.stdout)["results"] == {}


def test_user_data_fits_aws_limit(aws_script, cfg):
    # EC2 takes the script gzip-compressed (cloud-init decompresses it): the cap is on that.
    packed = bootscript.user_data(aws_script, "aws")
    assert gzip.decompress(packed).decode() == aws_script
    assert len(packed) <= bootscript.AWS_USER_DATA_LIMIT == 16384
    # Random letters do not compress much: 24 KB of them stay over the cap.
    noise = base64.b64encode(random.Random(7).randbytes(18000)).decode()
    huge = config_yaml().replace('"--chat-template-content-format=openai"',
                                 json.dumps("--x=" + noise))
    big = parse_config(huge)
    # Rendering checks nothing; the rule does, and synthesis runs the rules first.
    assert len(bootscript.user_data(render_boot_script(big, big.pools[0], "aws"), "aws")) > 16384
    with pytest.raises(OperationFailed, match=r"error: \[boot-script-size\] chat-70b/aws: "
                       r"pools\[0\]\.serving\.extra_args: .* limit of 16384"):
        refuse_invalid(big, big.targets(None, "aws"))


def test_registry_login_uses_the_node_identity(cfg, gcp_script):
    ecr = _all_scripts(cfg)["aws-chat-70b-ecr.sh"]
    assert "aws ecr get-login-password --region us-east-1 |" in ecr
    assert "docker login --username AWS --password-stdin " \
           "123456789012.dkr.ecr.us-east-1.amazonaws.com" in ecr
    assert "gcloud auth configure-docker us-docker.pkg.dev --quiet" in gcp_script
    assert "docker login" not in render_boot_script(cfg, cfg.pools[0], "aws")


def test_every_start_runs_the_boot_unit(aws_script):
    # A warm-pool node started from Stopped must rebuild the cache: a systemd unit enabled
    # for every boot, not a cloud-init per-instance step.
    assert "ExecStart=$SELF boot\n" in aws_script
    assert "WantedBy=multi-user.target\n" in aws_script
    assert "systemctl enable poolctl-node.service poolctl-queue.timer" in aws_script
    assert "fstab" not in aws_script


def test_phase_lines(aws_script):
    phases = re.findall(r"^\s+phase (\w+) ", aws_script, re.M)
    # boot's steps (the library), then hydrate: inside the image step (pull_image, the
    # pool's part), when the image is on the root volume already.
    assert phases == ["image", "gpus", "nvme", "weights", "serving", "readiness", "hydrate"]
    assert 'log "phase=$name seconds=$(since "$t0")"' in aws_script
    # the node's seconds (x1 on a node; the sandbox sets its speed x 1000)
    assert "* ${POOLCTL_TIME_SCALE_MILLI:-1000} / 1000000000" in aws_script


# --- strictness and errors ------------------------------------------------------------------

@pytest.mark.parametrize("pool_idx,cloud", [(0, "aws"), (1, "gcp")])
def test_every_context_key_is_required(cfg, pool_idx, cloud):
    env = bootscript.environment()
    assert env.undefined is jinja2.StrictUndefined
    ctx = bootscript.context(cfg, cfg.pools[pool_idx], cloud)
    template = env.get_template("node.sh.j2")
    template.render(ctx)
    for key in ctx:
        partial = {k: v for k, v in ctx.items() if k != key}
        with pytest.raises(jinja2.UndefinedError, match=f"'{key}' is undefined"):
            template.render(partial)


def test_strict_undefined_fails_on_a_missing_variable():
    tmpl = bootscript.environment().from_string("PORT={{ port }}\n")
    with pytest.raises(jinja2.UndefinedError, match="'port' is undefined"):
        tmpl.render()
    nvme = bootscript.environment().get_template("nvme-raid.sh.j2")
    with pytest.raises(jinja2.UndefinedError, match="'nvme_expected' is undefined"):
        nvme.render(cloud="aws", standalone=True, cache_mount="/x")


def test_usage_errors_name_the_key(cfg):
    """The boot script checks nothing itself: the targets and the rules (which synthesis runs
    before it renders) refuse what it could not render, naming the key."""
    with pytest.raises(UsageError, match=r"^--cloud gcp: pool 'chat-70b' has no `gcp:`"):
        cfg.targets("chat-70b", "gcp")
    bad = parse_config(config_yaml().replace("instance_type: p5.48xlarge",
                                             "instance_type: p9.huge"))
    with pytest.raises(OperationFailed, match=r"\[nvlink-8gpu\] chat-70b/aws: "
                       r"pools\[0\]\.aws\.instance_type: 'p9\.huge' is not"):
        refuse_invalid(bad, bad.targets(None, "aws"))
    tp3 = parse_config(config_yaml().replace("tensor_parallel: 2", "tensor_parallel: 3"))
    with pytest.raises(OperationFailed, match=r"\[tensor-parallel\] chat-70b: "
                       r"pools\[0\]\.serving\.tensor_parallel: 3 does not"):
        refuse_invalid(tp3, tp3.targets(None, "aws"))
    with pytest.raises(UsageError, match=r"^poolctl.yaml:\d+: pools\[0\]\.aws\.weights_uri: "
                       r"must start with s3://"):
        parse_config(config_yaml().replace("s3://acme-models/llama-3.1-70b", "gs://x/y"))


# --- shellcheck -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["aws-chat-70b.sh", "gcp-llama-405b.sh", "aws-chat-70b-ecr.sh",
                                  "aws-chat-70b-api-key.sh", "gcp-llama-405b-api-key.sh",
                                  "nvme-raid-aws.sh", "nvme-raid-gcp.sh",
                                  "aws-chat-70b-image.sh", "gcp-llama-405b-image.sh",
                                  "gcp-llama-405b-api-key-image.sh",
                                  "aws-chat-70b-compile-cache.sh",
                                  "gcp-llama-405b-compile-cache.sh",
                                  "aws-chat-70b-stream.sh", "aws-chat-70b-stream-image.sh",
                                  "boot-lib-aws.sh", "boot-lib-gcp.sh"])
def test_shellcheck_clean(cfg, name):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    text = _all_scripts(cfg)[name]
    out = subprocess.run(["shellcheck", "-s", "bash", "-"], input=text, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    first = "# shellcheck shell=bash" if name.startswith("boot-lib") else "#!/bin/bash\n"
    assert text.startswith(first)


# --- the boot library in the node image ---------------------------------------------------

def _functions(script: str) -> set[str]:
    return set(re.findall(r"^([a-z_]+)\(\) \{", script, re.M))


@pytest.mark.parametrize(("idx", "cloud"), [(0, "aws"), (1, "gcp")])
def test_image_variant_is_the_whole_script_split_in_two(cfg, idx, cloud):
    """The same functions either way: the library's (static for the cloud) and the pool's
    (its values: registry login, serving flags) in user data, none in both; the library
    holds no value of the pool."""
    whole = render_boot_script(cfg, cfg.pools[idx], cloud, from_image=False)
    part = render_boot_script(cfg, cfg.pools[idx], cloud, from_image=True)
    lib = bootscript.boot_library(cloud)
    assert _functions(part) & _functions(lib["text"]) == set()
    assert (_functions(part) | _functions(lib["text"])) - {"lib_failed"} == _functions(whole)
    assert _functions(part) - {"lib_failed"} == {"pull_image", "start_serving"}
    for value in (cfg.pools[idx].serving.image, cfg.pools[idx].model.id, "acme", "8000",
                  cfg.pools[idx].placement(cloud).weights.uri):
        assert value not in lib["text"], value
    assert f"{bootscript.LIB_VERSION_TAG}{lib['version']}\n" in lib["text"]
    assert f"POOLCTL_LIB_VERSION={lib['version']}\n" in part
    assert "/opt/poolctl/lib}/boot.sh\n" in part
    assert len(part.encode()) < len(whole.encode()) / 3


def test_a_build_record_does_not_choose_the_variant(cfg, tmp_path, monkeypatch):
    """The whole script by default, whatever the local build records say: the stacks hold
    both variants and Terraform picks one from the image's tag (tests/synth)."""
    from poolctl import node_image

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    ami = "ami-0aaaaaaaaaaaaaaaa"
    built = parse_config(config_yaml().replace("region: us-east-1\n",
                                               f"region: us-east-1\n      ami_id: {ami}\n", 1))
    pool = built.pools[0]
    assert pool.aws.ami_id == ami
    whole = render_boot_script(built, pool, "aws", from_image=False)
    node_image.save_record({"cloud": "aws", "image_id": ami, "serving_image": pool.serving.image,
                        "boot_lib_version": bootscript.boot_library("aws")["version"]})
    assert node_image.find_record("aws", ami) is not None
    assert render_boot_script(built, pool, "aws") == whole
    assert whole != render_boot_script(built, pool, "aws", from_image=True)


def test_systemd_units_are_valid(aws_script, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (apt-get install -y systemd)")
    units = re.findall(r"cat >/etc/systemd/system/(\S+) <<EOF\n(.*?)\nEOF\n", aws_script, re.S)
    assert [name for name, _ in units] == [
        "poolctl-node.service", "poolctl-queue.service", "poolctl-queue.timer"]
    self_path = tmp_path / "node.sh"  # stands in for $SELF, which must exist and run
    self_path.write_text("#!/bin/bash\n")
    self_path.chmod(0o755)
    for name, body in units:
        (tmp_path / name).write_text(body.replace("$SELF", str(self_path)) + "\n")
    out = subprocess.run(["systemd-analyze", "verify", "--man=no",
                          *(f"./{name}" for name, _ in units)],
                         cwd=tmp_path, capture_output=True, text=True)
    # verify exits 0 on unknown keys; they show up as messages naming the file.
    problems = [ln for ln in (out.stdout + out.stderr).splitlines() if str(tmp_path) in ln]
    assert out.returncode == 0 and problems == [], out.stdout + out.stderr


def test_streamed_weights_use_vllms_streamer_with_the_weights_roles_credentials(cfg):
    """aws.weights_load: stream. The flags are vLLM v0.34.0's: `--load-format runai_streamer`
    (vllm/config/load.py), `--model` an s3:// folder (transformers_utils/runai_utils.py
    SUPPORTED_SCHEMES), `--model-loader-extra-config` with `distributed`, one of the three keys
    RunaiModelStreamerLoader accepts (model_loader/runai_streamer_loader.py). The container's
    credentials are the weights role's, assumed by the node, in a root-only credentials file it
    renews; the node's cache, when whole, is read instead; a fetch pool has none of it."""
    st = load(stream=True)
    aws = render_boot_script(st, st.pools[0], Cloud.aws)
    assert "WEIGHTS_ROLE=acme-chat-70b-weights\n" in aws
    assert ('MODEL_ARGS=(--model "$WEIGHTS_URI" --load-format runai_streamer\n'
            "    --model-loader-extra-config '{\"distributed\": true}')") in aws  # TP 2
    assert '"$IMAGE" "${MODEL_ARGS[@]}" --served-model-name' in aws
    assert 'aws sts assume-role --role-arn "arn:$partition:iam::$account:role/$WEIGHTS_ROLE"' in aws
    assert "--duration-seconds 3600" in aws
    # into a root-only credentials file (0600 in a 0700 folder, renamed over the last one) the
    # container mounts read-only; its env-file names the file, never a key
    assert ('  if [[ -n $STREAM ]]; then\n    write_weights_credentials "$env_file"\n  else\n'
            '    rm -rf "$WEIGHTS_CREDENTIALS_DIR"\n  fi\n') in aws
    assert '"$id" "$secret" "$token" >"$tmp"' in aws
    assert 'mv -f "$tmp" "$WEIGHTS_CREDENTIALS_DIR/credentials"' in aws
    assert ("printf 'AWS_SHARED_CREDENTIALS_FILE=%s\\nAWS_REGION=%s\\n"
            "AWS_EC2_METADATA_DISABLED=true\\n'") in aws
    assert 'STREAM_MOUNT=(-v "$WEIGHTS_CREDENTIALS_DIR:$CONTAINER_CREDENTIALS_DIR:ro")' in aws
    assert '"${STREAM_MOUNT[@]}"' in aws
    # renewed by the node agent's periodic run before the session's hour is up
    assert "CREDENTIALS_RENEW_S=2700" in aws
    assert "publish-queue) renew_weights_credentials && publish_queue ;;" in aws
    # the write-through never fails the boot: `fail` is a log line in its subshell
    assert 'fail() { log "weights: not written through: $*"; exit 1; }' in aws
    lib = bootscript.boot_library("aws")["text"]
    assert "if ! declare -F weights_stream >/dev/null || ! weights_stream; then" in lib
    assert "if declare -F weights_write_through >/dev/null; then weights_write_through; fi" in lib
    # auto resolves by the plan: TP 2 on p5 fetches (sizing.weights_path)
    auto = parse_config(config_yaml().replace(
        "      weights_uri: s3://acme-models/llama-3.1-70b\n",
        "      weights_uri: s3://acme-models/llama-3.1-70b\n      weights_load: auto\n"))
    assert "runai" not in render_boot_script(auto, auto.pools[0], Cloud.aws)
    plain = render_boot_script(cfg, cfg.pools[0], Cloud.aws)
    assert "runai" not in plain and "WEIGHTS_ROLE" not in plain
    assert '"$IMAGE" --model "$WEIGHTS_DIR" --served-model-name' in plain


def test_the_compile_cache_is_vllms_own_folder_fetched_before_and_saved_after(cfg):
    """vLLM keeps torch.compile's artifacts in VLLM_CACHE_ROOT/torch_compile_cache
    (vllm/envs.py: ~/.cache/vllm; docs.vllm.ai, torch.compile integration): the container's
    /root/.cache is the node's $STATE/vllm-cache, VLLM_CACHE_ROOT is named, and the fetch and
    the save use $STATE/vllm-cache/vllm/torch_compile_cache. A pool without
    compile_cache_uri has none of it."""
    cc = load(compile_cache=True)
    aws = render_boot_script(cc, cc.pools[0], Cloud.aws)
    assert '-v "$STATE/vllm-cache:/root/.cache"' in aws
    assert "-e VLLM_CACHE_ROOT=/root/.cache/vllm" in aws
    assert 'local dir="$STATE/vllm-cache/vllm"' in aws
    assert 'compgen -G "$dir/torch_compile_cache/*"' in aws
    assert 'tar -C "$dir" -cf "$tmp" torch_compile_cache' in aws
    uri = re.search(r"^CC_URI=(\S+)$", aws, re.M)
    assert uri and re.fullmatch(
        r"s3://acme-models/compile-cache/meta-llama_Llama-3\.1-70B-Instruct-tp2-[0-9a-f]{16}"
        r"\.tar", uri.group(1)), aws
    gcp = render_boot_script(cc, cc.pools[1], Cloud.gcp)
    assert 'gcloud storage cp "$CC_URI" "$tmp" --quiet' in gcp and "aws s3" not in gcp
    # the key follows what the cache depends on: another image is another object
    other = load(compile_cache=True, image="vllm/vllm-openai:v0.11.1")
    assert bootscript.compile_cache(other.pools[0], Cloud.aws, "H100") != (
        bootscript.compile_cache(cc.pools[0], Cloud.aws, "H100"))
    plain = render_boot_script(cfg, cfg.pools[0], Cloud.aws)
    assert "CC_URI" not in plain and "VLLM_CACHE_ROOT" not in plain
