"""The CLI as users run it: exit codes, one-line errors, --json, and lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.configs import pool_yaml
from tests.inproc import check_no_internal_error

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"


def poolctl(*args, cwd=None, env=None):
    return check_no_internal_error(subprocess.run(
        [sys.executable, "-m", "poolctl", *args], capture_output=True, text=True, cwd=cwd,
        env=env, timeout=120))


def write(tmp_path, text):
    p = tmp_path / "poolctl.yaml"
    p.write_text(text)
    return p


def test_validate_example_ok():
    r = poolctl("validate", "-f", str(EXAMPLE))
    assert r.returncode == 0, r.stderr
    assert "ok: 0 error(s)" in r.stderr


def test_validate_rule_failure_exits_1(tmp_path):
    f = write(tmp_path, pool_yaml(instance_type="g6e.48xlarge"))
    r = poolctl("validate", "-f", str(f))
    assert r.returncode == 1
    assert "error: [nvlink-8gpu]" in r.stderr and "Traceback" not in r.stderr


def test_schema_error_exits_2_one_line(tmp_path):
    f = write(tmp_path, pool_yaml().replace("port: 8000", "port: 8000\n      colour: red"))
    r = poolctl("validate", "-f", str(f))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pools[0].serving.colour: unknown key" in lines[0]


def test_missing_file_exits_2(tmp_path):
    r = poolctl("plan", cwd=tmp_path)
    assert r.returncode == 2 and "-f/--file" in r.stderr and "Traceback" not in r.stderr


def test_bad_flag_exits_2():
    r = poolctl("plan", "--cloud", "azure", "-f", str(EXAMPLE))
    assert r.returncode == 2


def test_plan_refuses_on_failed_rule(tmp_path):
    f = write(tmp_path, pool_yaml(tp=1))
    r = poolctl("plan", "-f", str(f), "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert "nothing was changed" in r.stderr


def test_plan_json_contract_fields():
    r = poolctl("plan", "-f", str(EXAMPLE), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(p["pool"], p["cloud"]) for p in doc["pools"]] == [("chat-70b", "aws"),
                                                               ("chat-70b", "gcp")]
    p = doc["pools"][0]
    for key in ("pool", "cloud", "instance_type", "gpus_per_node", "tensor_parallel",
                "replicas_per_node", "weights_bytes_per_gpu", "kv_cache_bytes_per_token",
                "kv_cache_tokens_per_replica", "max_concurrent_sequences_per_replica"):
        assert key in p
    assert set(p["nodes"]) >= {"min", "max", "warm"}
    assert set(p["quota"]) >= {"name", "unit", "needed"}
    assert set(p["cost_per_hour_usd"]) == {"min", "max"}
    assert set(p["start_seconds"]) == {"cold", "warm"}
    assert p["kv_cache_bytes_per_token"] == 327_680
    assert p["nodes"] == {"min": 1, "max": 6, "warm": 2, "surge": 1}


def test_plan_pool_and_cloud_filters():
    r = poolctl("plan", "-f", str(EXAMPLE), "--json", "--cloud", "gcp", "--pool", "chat-70b")
    doc = json.loads(r.stdout)
    assert [p["cloud"] for p in doc["pools"]] == ["gcp"]
    r = poolctl("plan", "-f", str(EXAMPLE), "--pool", "nope")
    assert r.returncode == 2 and "--pool: no pool named 'nope'" in r.stderr


def test_poolctl_file_env(tmp_path):
    import os

    env = dict(os.environ, POOLCTL_FILE=str(EXAMPLE))
    assert poolctl("validate", cwd=tmp_path, env=env).returncode == 0


def modules_after(argv: list[str], expression: str) -> str:
    """stderr of a fresh `poolctl ARGV` process, then `expression` over its sys.modules."""
    code = (
        "import sys\n"
        "from poolctl.app import main\n"
        f"sys.argv = ['poolctl', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', {expression}, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return r.stderr


@pytest.mark.parametrize("argv", [["--help"], ["validate", "-f", str(EXAMPLE)],
                                  ["plan", "-f", str(EXAMPLE)],
                                  # past the folder check, which fails after the imports
                                  ["weights", "verify", "/nonexistent/weights"]])
def test_no_heavy_imports(argv):
    err = modules_after(argv, "[m for m in sys.modules if m.split('.')[0] in "
                        "('cdktn', 'jsii', 'boto3', 'botocore', 'google', "
                        "'cdktn_provider_aws', 'cdktn_provider_google', 'paramiko')]")
    assert "LOADED []" in err, err[-500:]


# The cloud SDKs poolctl.adaptors stands for; nothing else may import them.
SDKS = ("boto3", "botocore", "google")


def test_importing_any_module_loads_no_cloud_sdk():
    """Every module of poolctl imports without loading an SDK: they load on first use, through
    poolctl.adaptors (a command that calls no cloud never pays for them)."""
    code = (
        "import importlib, pkgutil, sys, poolctl\n"
        "for m in pkgutil.walk_packages(poolctl.__path__, 'poolctl.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        f"heavy = sorted({{m for m in sys.modules if m.split('.')[0] in {SDKS!r}}})\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in r.stderr, r.stderr[-500:]


def test_the_sdks_are_imported_by_the_adaptors_only():
    """No `import boto3` / `from google...` outside poolctl/adaptors, at module top or in a
    function: the adaptors are the one place an SDK loads (and says which extra is missing)."""
    import ast

    package = ROOT / "cli" / "poolctl"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "adaptors":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in SDKS]
    assert found == []


def test_schema_command():
    r = poolctl("schema")
    assert r.returncode == 0 and json.loads(r.stdout)["title"] == "poolctl.yaml"


def test_the_roots_summaries_are_the_commands_own():
    """The root lists each command without importing it (poolctl.app.LazyGroup); the line it
    shows must be the first sentence of the command's own help."""
    from poolctl.app import COMMANDS, load_command

    for entry in COMMANDS:
        loaded = load_command(entry).get_short_help_str(limit=200)
        assert entry.summary == loaded, entry.name


def test_help_loads_no_command_module():
    """The root's help lists the commands from poolctl.app.COMMANDS: no command module, and
    so not the config model (pydantic) either."""
    err = modules_after(["--help"], "sorted(m for m in sys.modules if m.startswith("
                        "('poolctl.commands', 'poolctl.config', 'pydantic')))")
    assert "LOADED []" in err, err[-500:]


def test_detailed_exitcode_makes_every_failure_exit_1(tmp_path):
    """`--detailed-exitcode` keeps 2 for "changes present" (Terraform's meaning), so bad
    usage, a bad file and a bad flag value exit 1, each with its one line."""
    r = poolctl("deploy", "--cloud", "aws", "-f", str(EXAMPLE), "--detailed-exitcode")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "poolctl: --detailed-exitcode: only with --plan-only (Terraform's meaning: exit 2 "
        "when the plan holds changes); add --plan-only"]
    f = write(tmp_path, pool_yaml().replace("port: 8000", "port: 8000\n      colour: red"))
    r = poolctl("deploy", "--cloud", "aws", "-f", str(f), "--plan-only", "--detailed-exitcode")
    assert r.returncode == 1 and "pools[0].serving.colour: unknown key" in r.stderr
    r = poolctl("destroy", "--cloud", "azure", "--plan-only", "--detailed-exitcode")
    assert r.returncode == 1 and "--cloud" in r.stderr
    # without the flag, the same bad flag value is a usage error as ever
    assert poolctl("destroy", "--cloud", "azure", "--plan-only").returncode == 2


def test_plan_says_what_a_shared_compile_cache_saves(tmp_path):
    text = pool_yaml(with_gcp=False, extra_aws="      compile_cache_uri: s3://acme-models/cc/\n")
    r = poolctl("plan", "-f", str(write(tmp_path, text)), "--cloud", "aws")
    assert r.returncode == 0, r.stderr
    # ENGINE_INIT_S 90 less torch.compile's 60 plus the cache's 15
    assert ("chat-70b/aws: compile cache shared (compile_cache_uri): engine_init 45 s instead "
            "of 90 (torch.compile 60 s, from the cache 15 s: docs/cloud-facts.md); the pool's "
            "first node compiles, 45 s more") in " ".join(r.stdout.split())


def test_profile_reaches_the_aws_calls_before_or_after_the_command(tmp_path):
    """`--profile NAME` as `aws --profile`: a root option, also after the command; a profile
    the AWS config lacks is botocore's ProfileNotFound, one line naming the flag, exit 2
    (before any call leaves the machine)."""
    import os

    from poolctl.app import lift_profile

    assert lift_profile(["status", "--cloud", "aws", "--profile", "prod", "--json"]) == [
        "--profile", "prod", "status", "--cloud", "aws", "--json"]
    assert lift_profile(["logs", "--profile=prod", "--", "--profile", "x"]) == [
        "--profile=prod", "logs", "--", "--profile", "x"]
    empty = tmp_path / "aws-config"
    empty.write_text("")
    env = {**os.environ, "AWS_CONFIG_FILE": str(empty), "AWS_SHARED_CREDENTIALS_FILE": str(empty),
           "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "x"}
    env.pop("AWS_PROFILE", None)
    for args in (["status", "--cloud", "aws", "-f", str(EXAMPLE), "--profile", "nope"],
                 ["--profile", "nope", "status", "--cloud", "aws", "-f", str(EXAMPLE)]):
        r = poolctl(*args, env=env)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines()[-1] == (
            "poolctl: --profile=nope: no such profile in the AWS config or credentials file "
            "(~/.aws/config, ~/.aws/credentials); fix the name, or drop --profile")
    r = poolctl("--profile", "two words", "validate", "-f", str(EXAMPLE))
    assert r.returncode == 2 and "--profile: two words is not a profile name" in r.stderr
