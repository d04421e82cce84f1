"""The config file, edited in place: one scalar line changed, comments and layout kept
(`rollout start` records the new version there, `rollback` the old one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from poolctl.config import Config, Loc, Pool, _LineLoader, parse_config
from poolctl.errors import UsageError

if TYPE_CHECKING:
    import yaml


# ---------------------------------------------------------------------------------------
# The config file, edited in place (one scalar line; comments and layout kept)


def _value_node(text: str, path: Loc) -> yaml.Node | None:

    try:
        node = yaml.compose(text, Loader=_LineLoader)
    except yaml.YAMLError:
        return None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    node = v
                    break
            else:
                return None
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return None
            node = node.value[part]
        else:
            return None
    return node


def _render_scalar(value: str, style: str | None) -> str:
    """`value` as a YAML scalar that reads back as the same string, in the old quote style
    where that style can carry it."""

    if style == "'" and "\n" not in value:
        return "'" + value.replace("'", "''") + "'"
    if style is None and value.strip() == value and value and "#" not in value:
        try:
            if yaml.safe_load(f"k: {value}\n") == {"k": value}:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar


def edit_scalar(text: str, path: Loc, value: str, source: str = "poolctl.yaml",
                plain: bool = False) -> tuple[str, str, int]:
    """Replace the scalar at `path` with `value`: (new text, old value, line number).

    Only the scalar's own characters change. `plain` writes `value` unquoted (a number or
    a word YAML reads as it is written: `8`, `p5.48xlarge`). UsageError when the key is not
    literally in the file (a default applies) or is not a plain one-line value."""

    key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(
        ".[", "[")
    node = _value_node(text, path)
    if node is None:
        raise UsageError(
            f"{source}: {key} is not written in the file (its default applies); add it "
            f"there, then run the command again")
    if not isinstance(node, yaml.ScalarNode) or node.style in ("|", ">") or (
            node.start_mark.line != node.end_mark.line):
        raise UsageError(f"{source}:{node.start_mark.line + 1}: {key} must be a one-line "
                         "scalar for poolctl to change it in place; write it on one line")
    start, end = node.start_mark.index, node.end_mark.index
    new_text = text[:start] + (value if plain else _render_scalar(value, node.style)) + text[end:]
    check = _value_node(new_text, path)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{node.start_mark.line + 1}: {key}: cannot write "
                         f"{value!r} in place; edit the file by hand")
    return new_text, node.value, node.start_mark.line + 1


def set_scalar(text: str, path: Loc, value: str, source: str = "poolctl.yaml",
               plain: bool = False) -> tuple[str, str | None, int]:
    """`edit_scalar`, or, when the key is not written (its default applies), one new line
    `key: value` at the top of its block-style mapping: (new text, old value or None, line)."""

    if _value_node(text, path) is not None:
        return edit_scalar(text, path, value, source, plain)
    parent = _value_node(text, path[:-1])
    where = ".".join(str(p) for p in path[:-1] if not isinstance(p, int))
    if not isinstance(parent, yaml.MappingNode) or parent.flow_style or not parent.value:
        raise UsageError(f"{source}: {where}: not a block mapping poolctl can add "
                         f"`{path[-1]}` to; add `{path[-1]}:` there by hand")
    first = parent.value[0][0].start_mark
    start = first.index - first.column
    line = f"{' ' * first.column}{path[-1]}: {value if plain else _render_scalar(value, None)}\n"
    new_text = text[:start] + line + text[start:]
    check = _value_node(new_text, path)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{first.line + 1}: {where}: cannot add {path[-1]}={value!r} "
                         "in place; edit the file by hand")
    return new_text, None, first.line + 1


def unset_scalar(text: str, path: Loc, source: str = "poolctl.yaml"
                 ) -> tuple[str, str | None, int | None]:
    """The inverse of `set_scalar` adding a line: remove the one line `key: value` at `path`,
    so that the default applies again: (new text, old value or None, line or None). A key
    not written leaves the text as it is."""

    parent = _value_node(text, path[:-1])
    pairs = parent.value if isinstance(parent, yaml.MappingNode) else []
    pair = next(((k, v) for k, v in pairs if k.value == path[-1]), None)
    if pair is None:
        return text, None, None
    k, v = pair
    assert isinstance(parent, yaml.MappingNode)  # the pair is one of its own
    start = text.rfind("\n", 0, k.start_mark.index) + 1
    end = text.find("\n", v.end_mark.index)
    end = len(text) if end < 0 else end + 1
    rest = text[v.end_mark.index:end].strip()
    new_text = text[:start] + text[end:]
    where = ".".join(str(p) for p in path if not isinstance(p, int))
    if (not isinstance(v, yaml.ScalarNode) or parent.flow_style or len(pairs) < 2
            or k.start_mark.line != v.end_mark.line or text[start:k.start_mark.index].strip()
            or (rest and not rest.startswith("#")) or _value_node(new_text, path) is not None):
        raise UsageError(f"{source}:{k.start_mark.line + 1}: {where}: not a line of its own "
                         "poolctl can remove; delete it by hand")
    return new_text, v.value, k.start_mark.line + 1


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.poolctl-tmp")
    tmp.write_text(text)
    try:
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    except OSError:
        pass
    tmp.replace(path)


ROLLOUT_KEYS = {"image": ("serving", "image"), "model_version": ("model", "version"),
                "ami_id": ("aws", "ami_id"), "gcp_image": ("gcp", "image")}
# The node image (`rollout start --node-image`): a key a file may not write yet (its default
# applies), so it is added in place rather than refused.
NODE_IMAGE_KEYS = {"aws": "ami_id", "gcp": "gcp_image"}
ROLLOUT_LABELS = {k: ".".join(v) for k, v in ROLLOUT_KEYS.items()}


def _rollout_key(label: str) -> str:
    return next(k for k, v in ROLLOUT_LABELS.items() if v == label)


def _edit(key: str) -> Callable[..., tuple[str, str | None, int]]:
    return set_scalar if key in NODE_IMAGE_KEYS.values() else edit_scalar


def _write_key(key: str, text: str, path: Loc, value: str | None, source: str
               ) -> tuple[str, str | None, int | None]:
    """The file's text with `value` for `key`; None (node images only): the line removed."""
    if value is None:
        return unset_scalar(text, path, source=source)
    return _edit(key)(text, path, value, source=source)


def record_in_file(file_path: Path, cfg: Config, pool: Pool, key: str, value: str | None
                   ) -> tuple[Config, str | None, bool, int | None]:
    """Write `value` for `key` (a ROLLOUT_KEYS key) of `pool` into the file (None: remove a
    node image's line): (re-parsed config, old value, changed?, line)."""
    idx = [p.name for p in cfg.pools].index(pool.name)
    path = ("pools", idx, *ROLLOUT_KEYS[key])
    text = file_path.read_text()
    new_text, old, line = _write_key(key, text, path, value, str(file_path))
    changed = new_text != text
    new_cfg = parse_config(new_text, source=str(file_path))
    if changed:
        write_atomic(file_path, new_text)
    return new_cfg, old, changed, line
