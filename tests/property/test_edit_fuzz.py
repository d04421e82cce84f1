"""The in-place editor (`plan --search --write`, `perf fit --write`, rollouts) on configs
whose pools share values through YAML anchors, aliases and merge keys, and `init` into
folders laid with symlinks (issue 31), drawn at random:

- an edit either changes exactly the value asked for, in the pool asked for (every other
  pool reads as before), or refuses in one line naming the anchor: never another pool's
  value changed through a shared node;
- `init` writes only inside --dir (or refuses in one line): nothing outside changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from poolctl.errors import UsageError
from poolctl.runtime.fileedit import set_scalar
from tests import inproc

POOL = """\
  - name: {name}
    model: {model}
    serving: {serving}
    scaling: {scaling}
"""
BLOCKS = {
    "model": "\n      id: meta-llama/Llama-3.1-8B-Instruct\n      dtype: bfloat16",
    "serving": "\n      tensor_parallel: 1\n      max_num_seqs: 64",
    "scaling": "\n      min_replicas: 1\n      max_replicas: 4",
}
KEYS = [("serving", "tensor_parallel"), ("serving", "max_num_seqs"), ("scaling", "min_replicas"),
        ("scaling", "max_replicas"), ("model", "dtype")]


@st.composite
def shared_config(draw) -> str:
    """Three pools; each block of each pool is written out, anchored (&name) for later
    pools, an alias (*name) of an earlier anchor, or a mapping merging one (<<: *name)."""
    anchors: dict[str, list[str]] = {k: [] for k in BLOCKS}
    pools = []
    for i in range(3):
        parts = {}
        for key, body in BLOCKS.items():
            how = draw(st.sampled_from(["plain", "anchor", "alias", "merge"]))
            if how in ("alias", "merge") and not anchors[key]:
                how = "plain"
            if how == "plain":
                parts[key] = body
            elif how == "anchor":
                name = f"{key[:2]}{i}"
                anchors[key].append(name)
                parts[key] = f"&{name}{body}"
            elif how == "alias":
                parts[key] = "*" + draw(st.sampled_from(anchors[key]))
            else:
                name = draw(st.sampled_from(anchors[key]))
                extra = draw(st.sampled_from(["", "\n      max_num_seqs: 32"
                                              if key == "serving" else ""]))
                parts[key] = f"\n      <<: *{name}{extra}"
        pools.append(POOL.format(name=f"p{i}", **parts))
    return "project: acme\npools:\n" + "".join(pools)


@given(text=shared_config(), idx=st.integers(0, 2), key=st.sampled_from(KEYS),
       value=st.sampled_from(["2", "8", "17"]))
def test_an_edit_changes_the_pool_asked_for_or_refuses_naming_the_anchor(text, idx, key,
                                                                          value):
    before = yaml.safe_load(text)
    try:
        new, _, _ = set_scalar(text, ("pools", idx, *key), value, plain=True)
    except UsageError as e:
        msg = str(e)
        assert "\n" not in msg and ("&" in msg or "not a block mapping" in msg
                                    or "by hand" in msg), msg
        return
    after = yaml.safe_load(new)
    for i in range(3):
        for block in BLOCKS:
            want = dict(before["pools"][i][block])
            if i == idx and block == key[0]:
                want[key[1]] = int(value) if value.isdigit() else value
            assert after["pools"][i][block] == want, (i, block, new)


LAYOUTS = st.lists(st.tuples(
    st.sampled_from(["poolctl.yaml", "cdktf.json", ".github", ".github/workflows",
                     ".github/workflows/poolctl.yml"]),
    st.sampled_from(["dangling", "file", "dir", "regular", "folder"])), max_size=3)


@given(layout=LAYOUTS, force=st.booleans())
def test_init_writes_only_inside_dir(layout, force, tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    d, outside = root / "d", root / "outside"
    d.mkdir()
    outside.mkdir()
    (outside / "file").write_text("theirs\n")
    for rel, kind in layout:
        p = d / rel
        if os.path.lexists(p) or not p.parent.is_dir() or p.parent.is_symlink():
            continue
        if kind == "dangling":
            p.symlink_to(outside / "nothing" / "here")
        elif kind == "file":
            p.symlink_to(outside / "file")
        elif kind == "dir":
            p.symlink_to(outside)
        elif kind == "regular":
            p.write_text("mine\n")
        else:
            p.mkdir()
    snapshot = {q: q.read_bytes() if q.is_file() else None for q in outside.rglob("*")}
    r = inproc.run(["init", "--dir", str(d), *(["--force"] if force else [])],
                   env={**os.environ, "POOLCTL_HOME": str(root / "home")}, cwd=root,
                   timeout=60)
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("poolctl: "), r.stderr
    after = {q: q.read_bytes() if q.is_file() else None for q in outside.rglob("*")}
    assert after == snapshot, "init wrote outside --dir"
    assert not (outside / "nothing").exists()
    if r.returncode == 0:
        assert (d / "poolctl.yaml").is_file() and not (d / "poolctl.yaml").is_symlink()
        assert Path(os.path.realpath(d / ".github" / "workflows" / "poolctl.yml")
                    ).is_relative_to(os.path.realpath(d))
