"""Model presets, `catalog`, `init`, `--version` and completion, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from poolctl.models import estimate_params, load_presets
from tests import inproc

ROOT = Path(__file__).resolve().parents[2]


def poolctl(*args, cwd=None, env=None):
    # In this worker (tests/inproc.py): the synth's jsii kernel loads once.
    return inproc.run_argv([sys.executable, "-m", "poolctl", *args], capture_output=True,
                           text=True, cwd=cwd, env=env, timeout=120)


def test_every_preset_names_its_source_and_is_consistent():
    presets = load_presets()
    assert len(presets) >= 20
    for p in presets.values():
        assert p.source.startswith(f"https://huggingface.co/{p.id}/") and p.source.endswith(
            "config.json")
        assert p.attention_heads % p.kv_heads == 0, p.id


def test_param_estimate_matches_the_cards():
    # Llama-3.1-405B: vocab 128256, hidden 16384, intermediate 53248, 126 layers, 128 heads,
    # 8 KV heads: 405.85 B; the preset rounds to 405.9.
    cfg = {"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
           "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256}
    assert estimate_params(cfg) == 405.85
    # Qwen3-30B-A3B: 128 experts of moe_intermediate 768, hidden 2048, 48 layers, 32 heads of
    # 128 (q is 4096 wide), 4 KV heads, vocab 151936, untied: 30.53 B (card: 30.5 B).
    moe = {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_experts": 128, "num_hidden_layers": 48, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936}
    assert round(estimate_params(moe), 1) == load_presets()["Qwen/Qwen3-30B-A3B"].params_b


def test_catalog_json():
    r = poolctl("catalog", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    p5 = next(t for t in data["instance_types"] if t["name"] == "p5.48xlarge")
    # the catalog's row (EC2 DescribeInstanceTypes reports 81920 MiB per H100)
    assert (p5["gpus"], p5["hbm_mib_per_gpu"], p5["nvlink"], p5["vcpus"]) == (8, 81920, True, 192)
    assert p5["quota"]["name"] == "L-417A185B" and p5["price"]["date"]
    llama = next(m for m in data["models"] if m["id"] == "meta-llama/Llama-3.1-70B-Instruct")
    # 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes
    assert llama["kv_bytes_per_token_bf16"] == 327_680
    r = poolctl("catalog", "--cloud", "gcp", env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0 and "a3-highgpu-8g" in r.stdout and "p5.48xlarge" not in r.stdout


def test_version_and_completion():
    r = poolctl("--version")
    assert r.returncode == 0 and r.stdout.startswith("poolctl ")
    # the console script, as a shell completes it (under `python -m` the name differs)
    script = Path(sys.executable).parent / "poolctl"
    r = subprocess.run([str(script), "--show-completion", "bash"], capture_output=True,
                       text=True, timeout=60, env={
                           # the shell as an argument, not guessed from the process tree
                           # (an xdist worker has no shell among its parents)
                           **os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert r.returncode == 0
    assert "complete -o default -F _poolctl_completion poolctl" in r.stdout, r.stdout


def test_init_refuses_to_overwrite(tmp_path):
    (tmp_path / "cdktf.json").write_text("{}")
    r = poolctl("init", "--dir", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--force" in r.stderr and "cdktf.json" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdktf.json"]  # nothing half-written
    r = poolctl("init", "--model", "Qwen/Qwen3-32", "--dir", str(tmp_path / "x"))
    assert r.returncode == 2 and "(did you mean 'Qwen/Qwen3-32B'?)" in r.stderr, r.stderr


def test_init_picks_a_type_the_model_fits(tmp_path):
    # 405B in bfloat16 is 812 GB: over 8 x 80 GB H100 (p5), so init moves to 8 x 141 GB H200
    r = poolctl("init", "--model", "meta-llama/Llama-3.1-405B-Instruct", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    pool = yaml.safe_load((tmp_path / "poolctl.yaml").read_text())["pools"][0]
    assert pool["aws"]["instance_type"] == "p5e.48xlarge"
    assert pool["serving"]["tensor_parallel"] == 8
    assert pool["model"] == {"id": "meta-llama/Llama-3.1-405B-Instruct"}


def test_init_then_validate_then_synth(tmp_path):
    r = poolctl("init", "--model", "Qwen/Qwen2.5-7B-Instruct", "--cloud", "gcp",
                "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        ".github/workflows/poolctl.yml", "cdktf.json", "poolctl.yaml"]
    assert json.loads((tmp_path / "cdktf.json").read_text())["app"] == (
        "python -m poolctl_stacks.app")
    # The workflow's steps as written, after its install step: that step installs the CLI
    # this repository's package.json installs (node_modules/.bin), at the same version.
    steps = yaml.safe_load((tmp_path / ".github/workflows/poolctl.yml").read_text())
    runs = [s["run"] for s in steps["jobs"]["check"]["steps"] if "run" in s]
    install, *rest = runs
    cli, version = install.rsplit("npm install -g ", 1)[1].split("@")
    assert json.loads((ROOT / "package.json").read_text())["devDependencies"][cli] == version
    assert rest == ["poolctl validate", "poolctl plan --cloud gcp --json > plan.json",
                    "cdktn synth"]
    bin_dir = ROOT / "node_modules" / ".bin"
    if not (bin_dir / "cdktn").exists():
        pytest.skip("the cdktn CLI is not installed (scripts/setup runs `npm ci`)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "CHECKPOINT_DISABLE": "1"}
    env.pop("POOLCTL_EXAMPLES_ROOT", None)
    for step in rest:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (step, (r.stdout + r.stderr)[-3000:])
    assert json.loads((tmp_path / "plan.json").read_text())["pools"][0]["cloud"] == "gcp"
    (stack,) = (tmp_path / "cdktf.out" / "stacks").glob("*/cdk.tf.json")
    tf = json.loads(stack.read_text())
    assert "google_compute_region_instance_group_manager" in tf["resource"]


def test_cdktf_app_reads_the_users_file(tmp_path):
    """cdktf.json's app in a user's folder: $POOLCTL_FILE (or ./poolctl.yaml), refused with
    the rule's line when a rule fails (the synthesis itself is covered above)."""
    assert poolctl("init", "--dir", str(tmp_path)).returncode == 0
    text = (tmp_path / "poolctl.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(text.replace("tensor_parallel: 4", "tensor_parallel: 3"))
    env = {**os.environ, "POOLCTL_FILE": "bad.yaml", "CDKTF_OUTDIR": str(tmp_path / "out")}
    env.pop("POOLCTL_EXAMPLES_ROOT", None)
    r = subprocess.run([sys.executable, "-m", "poolctl_stacks.app"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    line = text.splitlines().index(next(x for x in text.splitlines()
                                         if "tensor_parallel: 4" in x)) + 1
    assert r.returncode == 1
    assert r.stderr.startswith(f"poolctl: bad.yaml:{line}: error: [tensor-parallel]"), r.stderr
    assert not (tmp_path / "out").exists()


LLAMA_8B_CONFIG = {  # meta-llama/Llama-3.1-8B-Instruct's config.json, the keys poolctl reads
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def test_config_json_through_the_cli(tmp_path):
    assert poolctl("init", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                   "--dir", str(tmp_path)).returncode == 0
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG))
    f = tmp_path / "poolctl.yaml"
    f.write_text(f.read_text().replace(
        "      id: meta-llama/Llama-3.1-8B-Instruct",
        "      id: acme/llama-8b-tuned\n      config_json: hf/config.json"))
    r = poolctl("validate", "-f", str(f))
    assert r.returncode == 0, r.stderr
    assert "info: [model-shape]" in r.stderr and "8.03 B estimated from the shapes" in r.stderr
    r = poolctl("plan", "-f", str(f), "--json")
    (plan,) = json.loads(r.stdout)["pools"]
    # 8.03e9 parameters x 2 bytes (bfloat16); KV: 2 x 32 layers x 8 heads x 128 x 2 bytes
    assert plan["weights_bytes"] == 16_060_000_000
    assert plan["kv_cache_bytes_per_token"] == 131_072


def test_model_shape_and_schema_errors_through_the_cli(tmp_path):
    assert poolctl("init", "--dir", str(tmp_path)).returncode == 0
    f = tmp_path / "poolctl.yaml"
    text = f.read_text()
    f.write_text(text.replace("      id: meta-llama/Llama-3.1-70B-Instruct",
                              "      id: meta-llama/Llama-3.1-70B-Instruct\n      kv_heads: 64"))
    r = poolctl("validate", "-f", str(f))
    line = f.read_text().splitlines().index("      kv_heads: 64") + 1
    assert r.returncode == 1
    # 64 KV heads x 80 layers x 128 is 8x the preset's 8 KV heads: named on the file's line
    assert f"{f}:{line}: error: [model-shape] llama-3-1-70b-instruct: pools[0].model.kv_heads: " \
        "layers 80 x kv_heads 64 x head_dim 128 gives 8.0x the KV cache per token" in r.stderr
    f.write_text(text.replace("queue_target: 4", "queue_targte: 4").replace(
        "instance_type: p5.48xlarge", "instance_type: p5.48xlarg"))
    r = poolctl("validate", "-f", str(f))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unknown key (did you mean 'queue_target'?)" in r.stderr
    f.write_text(text.replace("instance_type: p5.48xlarge", "instance_type: p5.48xlarg"))
    r = poolctl("validate", "-f", str(f))
    assert r.returncode == 1 and "(did you mean 'p5.48xlarge'?)" in r.stderr


def test_catalog_and_init_load_no_cloud_sdk(tmp_path):
    code = (
        "import sys\n"
        "from poolctl.app import main\n"
        "for argv in (['catalog'], ['init', '--dir', sys.argv[1]]):\n"
        "    sys.argv = ['poolctl', *argv]\n"
        "    try:\n        main()\n    except SystemExit as e:\n        assert not e.code, e\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('cdktn', 'jsii', 'boto3', 'botocore', 'google', 'paramiko')]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert "HEAVY []" in r.stderr, r.stderr[-500:]
