"""The config file, edited in place: one scalar line changed, comments and layout kept
(`rollout start` records the new version there, `rollback` the old one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from poolctl.config import Config, LineLoader, Loc, Pool, parse_config
from poolctl.errors import UsageError
from poolctl.files import replace_file

# ---------------------------------------------------------------------------------------
# The config file, edited in place (one scalar line; comments and layout kept)


class _EditLoader(LineLoader):
    """The YAML reader, noting which nodes an alias (`*name`) reaches: editing one of them
    in place would change every place that shares it (another pool's values)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.shared: dict[int, str] = {}  # id(node) -> its anchor

        self.names: dict[int, str] = {}  # id(node) -> the anchor it defines

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        alias = self.check_event(yaml.AliasEvent)
        anchor = getattr(self.peek_event(), "anchor", None)  # type: ignore[no-untyped-call]
        node = super().compose_node(parent, index)
        if node is None:
            return None
        if alias:
            self.shared[id(node)] = str(anchor)
        elif anchor is not None:
            self.names[id(node)] = str(anchor)
        return node


def _compose(text: str) -> tuple[yaml.Node | None, dict[int, str], dict[int, str]]:
    loader = _EditLoader(text)
    try:
        return loader.get_single_node(), loader.shared, loader.names
    finally:
        loader.dispose()


def _key_name(path: Loc) -> str:
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(
        ".[", "[")


def value_at(text: str, path: Loc, source: str = "poolctl.yaml") -> yaml.Node | None:
    """The node at `path` as the file writes it, or None (not written: a default applies).
    UsageError when the way to it passes a node an alias shares (`&name` ... `*name`, a merge
    key `<<: *name` included): an edit there would change every place that shares it."""
    try:
        node, shared, names = _compose(text)
    except yaml.YAMLError:
        return None
    for i, part in enumerate(path):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    node = v
                    break
            else:
                merge = next((v for k, v in node.value if k.tag == "tag:yaml.org,2002:merge"
                              or k.value == "<<"), None)
                if merge is not None and i < len(path) - 1:
                    anchor = shared.get(id(merge)) or names.get(id(merge), "")
                    raise UsageError(
                        f"{source}:{merge.start_mark.line + 1}: {_key_name(path[:i + 1])} "
                        f"comes from the merge key `<<: *{anchor}`; poolctl does not edit a "
                        f"value shared through &{anchor}: write {_key_name(path[i:i + 1])} "
                        "out in this pool, or edit the anchor by hand")
                return None
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return None
            node = node.value[part]
        else:
            return None
        if id(node) in shared:
            anchor = shared[id(node)]
            raise UsageError(
                f"{source}:{node.start_mark.line + 1}: {_key_name(path[:i + 1])} is shared "
                f"through the anchor &{anchor} (another place of the file reads it as "
                f"*{anchor}); poolctl does not edit shared values in place: write "
                f"{_key_name(path[:i + 1])} out where it is used, or edit &{anchor} by hand")
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

    key = _key_name(path)
    node = value_at(text, path, source)
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
    check = value_at(new_text, path, source)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{node.start_mark.line + 1}: {key}: cannot write "
                         f"{value!r} in place; edit the file by hand")
    return new_text, node.value, node.start_mark.line + 1


def set_scalar(text: str, path: Loc, value: str, source: str = "poolctl.yaml",
               plain: bool = False) -> tuple[str, str | None, int]:
    """`edit_scalar`, or, when the key is not written (its default applies), one new line
    `key: value` at the top of its block-style mapping: (new text, old value or None, line)."""

    if value_at(text, path, source) is not None:
        return edit_scalar(text, path, value, source, plain)
    parent = value_at(text, path[:-1], source)
    rendered = value if plain else _render_scalar(value, None)
    if parent is None and len(path) > 1 and isinstance(path[-2], str):
        # The mapping itself is not written (say a pool's `perf:`): a new block of one line,
        # after the first line of the mapping above it (a pool's `name:`).
        grand = value_at(text, path[:-2], source)
        if isinstance(grand, yaml.MappingNode) and not grand.flow_style and grand.value:
            k0, v0 = grand.value[0]
            if isinstance(v0, yaml.ScalarNode) and k0.start_mark.line == v0.end_mark.line:
                end = text.find("\n", v0.end_mark.index)
                end = len(text) if end < 0 else end + 1
                ind = " " * k0.start_mark.column
                new_text = (text[:end] + ("" if text[:end].endswith("\n") else "\n")
                            + f"{ind}{path[-2]}:\n{ind}  {path[-1]}: {rendered}\n" + text[end:])
                check = value_at(new_text, path, source)
                if check is not None and check.value == value:
                    return new_text, None, k0.start_mark.line + 3
    where = ".".join(str(p) for p in path[:-1] if not isinstance(p, int))
    if not isinstance(parent, yaml.MappingNode) or parent.flow_style or not parent.value:
        raise UsageError(f"{source}: {where}: not a block mapping poolctl can add "
                         f"`{path[-1]}` to; add `{path[-1]}:` there by hand")
    first = parent.value[0][0].start_mark
    start = first.index - first.column
    line = f"{' ' * first.column}{path[-1]}: {rendered}\n"
    new_text = text[:start] + line + text[start:]
    check = value_at(new_text, path, source)
    if check is None or check.value != value:
        raise UsageError(f"{source}:{first.line + 1}: {where}: cannot add {path[-1]}={value!r} "
                         "in place; edit the file by hand")
    return new_text, None, first.line + 1


def unset_scalar(text: str, path: Loc, source: str = "poolctl.yaml"
                 ) -> tuple[str, str | None, int | None]:
    """The inverse of `set_scalar` adding a line: remove the one line `key: value` at `path`,
    so that the default applies again: (new text, old value or None, line or None). A key
    not written leaves the text as it is."""

    parent = value_at(text, path[:-1], source)
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
            or (rest and not rest.startswith("#")) or value_at(new_text, path, source) is not None):
        raise UsageError(f"{source}:{k.start_mark.line + 1}: {where}: not a line of its own "
                         "poolctl can remove; delete it by hand")
    return new_text, v.value, k.start_mark.line + 1




ROLLOUT_KEYS = {"image": ("serving", "image"), "model_version": ("model", "version"),
                "ami_id": ("aws", "ami_id"), "gcp_image": ("gcp", "image")}
# The node image (`rollout start --node-image`): a key a file may not write yet (its default
# applies), so it is added in place rather than refused.
NODE_IMAGE_KEYS = {"aws": "ami_id", "gcp": "gcp_image"}
ROLLOUT_LABELS = {k: ".".join(v) for k, v in ROLLOUT_KEYS.items()}


def rollout_key(label: str) -> str:
    return next(k for k, v in ROLLOUT_LABELS.items() if v == label)


def _edit(key: str) -> Callable[..., tuple[str, str | None, int]]:
    return set_scalar if key in NODE_IMAGE_KEYS.values() else edit_scalar


def write_key(key: str, text: str, path: Loc, value: str | None, source: str
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
    new_text, old, line = write_key(key, text, path, value, str(file_path))
    changed = new_text != text
    new_cfg = parse_config(new_text, source=str(file_path))
    if changed:
        replace_file(file_path, new_text)
    return new_cfg, old, changed, line
