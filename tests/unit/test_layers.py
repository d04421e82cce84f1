"""The floors of docs/architecture.md hold for every module (lint-imports, run by scripts/test,
checks the imports; these tests check that the contract covers what it should)."""

from __future__ import annotations

import ast
import pkgutil
import re
import tomllib
from pathlib import Path

import poolctl

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"]


def test_every_module_of_poolctl_is_on_a_floor():
    """A new top-level module outside the layers would be free to import anything."""
    (layers,) = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    listed = {m.strip() for layer in layers for m in re.split(r"[|:]", layer)}
    tops = {f"poolctl.{m.name}" for m in pkgutil.iter_modules(poolctl.__path__)}
    assert tops - listed == set()
    assert listed - tops == set()  # no name left behind by a rename


def own_imports_in_functions(path: Path, root: Path = ROOT) -> list[str]:
    found: dict[str, None] = {}  # (a nested function's imports are walked twice)
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names])
            if any(n.split(".")[0] in ("poolctl", "poolctl_stacks") for n in names):
                found[f"{path.relative_to(root)}:{node.lineno}"] = None
    return list(found)


def test_poolctl_imports_its_own_modules_at_the_top():
    """A function-level import of poolctl's own modules hides a circle from the reader (and
    only the heavy third-party SDKs need loading late: poolctl.adaptors). The one exception:
    the stacks load one cloud's provider per synthesis."""
    allowed = {"stacks/poolctl_stacks/app.py"}
    found = [hit for base in ("cli/poolctl", "stacks/poolctl_stacks")
             for path in sorted((ROOT / base).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in allowed
             for hit in own_imports_in_functions(path)]
    assert found == []


def test_the_check_finds_a_function_level_import(tmp_path):
    bad = tmp_path / "mod.py"
    bad.write_text("import json\n\n\ndef f():\n    import yaml\n\n    def g():\n"
                   "        from poolctl import sizing\n        return sizing\n    return g\n")
    assert own_imports_in_functions(bad, tmp_path) == ["mod.py:8"]


def test_no_library_module_is_several_modules():
    """No module of the library is over 800 lines (issue 32): past that a file is several
    modules, and becomes a package (config/, simulate/, the sandbox's capacity by API)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    long = {str(f.relative_to(root)): n for pkg in ("cli/poolctl", "stacks/poolctl_stacks")
            for f in (root / pkg).rglob("*.py")
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > 800}
    assert long == {}
