"""The YAML reader, published as such: safe loading with line numbers for every key path, a
bound on what aliases expand to, and the words that name a key path (`format_loc`). The
in-place editor (`runtime/fileedit.py`) composes with `LineLoader` too.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from poolctl.config.shapes import Loc
from poolctl.errors import UsageError

# ---------------------------------------------------------------------------------------
# Loading: one clear line per problem, with the key path and, where YAML has it, the line.


# A file over this size is not a pool config; refusing it bounds what YAML has to parse.
MAX_FILE_BYTES = 4 * 2**20
# Anchors and aliases may share a block between pools, but the document they expand to stays
# small: a "billion laughs" file is a few lines that expand to billions of nodes, which every
# walk over the data (validation included) would then visit.
MAX_EXPANDED_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


class _Loader(yaml.SafeLoader):
    """SafeLoader whose integers too long for int() (over 4,300 digits) stay text, so the
    schema refuses them naming their key instead of the parser failing without one."""

    # Any: an int, or the text of one too long for int() (the base class promises an int)
    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return str(node.value)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# The YAML reader, published: the in-place editor (runtime/fileedit.py) composes with it too.
LineLoader = _Loader


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse alias cycles and documents that expand past MAX_EXPANDED_NODES (counted over
    shared nodes without expanding them; iterative, so deep nesting cannot overflow)."""
    size: dict[int, int] = {}
    state: dict[int, int] = {}  # 1: being counted (on the path), 2: counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            state[key] = 2
            if size[key] > MAX_EXPANDED_NODES:
                raise UsageError(
                    f"{source}:{node.start_mark.line + 1}: its aliases (*name) expand to over "
                    f"{MAX_EXPANDED_NODES:,} values; write the values out instead of nesting "
                    "aliases")
            continue
        if state.get(key) == 2:
            continue
        if state.get(key) == 1:
            raise UsageError(f"{source}:{node.start_mark.line + 1}: an alias refers to a block "
                             "that contains it; remove the recursive alias")
        state[key] = 1
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _walk_lines(root: yaml.Node, source: str) -> dict[Loc, int]:
    """The line of every key path; refuses what YAML would resolve silently or not at all:
    a key given twice in one mapping (YAML keeps the last), two `<<` merge keys in one
    mapping (the second overrides the first), and a list or mapping as a key."""
    lines: dict[Loc, int] = {}

    def walk(node: yaml.Node, path: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            merge_line = 0
            for k, v in node.value:
                line = k.start_mark.line + 1
                if not isinstance(k, yaml.ScalarNode):
                    what = "a list" if isinstance(k, yaml.SequenceNode) else "a mapping"
                    raise UsageError(
                        f"{source}:{line}: {format_loc(path) or '(top)'}: a key is {what} "
                        "(YAML's `? ` complex key); keys are plain names, write `name: value`")
                if k.tag not in (_MERGE_TAG, _STR_TAG):
                    kind = k.tag.rsplit(":", 1)[-1]
                    raise UsageError(
                        f"{source}:{line}: {format_loc(path) or '(top)'}: the key "
                        f"{shown(k.value)} reads as a YAML {kind}, not a name; keys are names "
                        "like `port`")
                if k.tag == _MERGE_TAG:
                    if merge_line:
                        raise UsageError(
                            f"{source}:{line}: {format_loc((*path, '<<'))}: merge key given "
                            f"twice (first on line {merge_line}), the second would override "
                            "the first; merge both in one: `<<: [*first, *second]`")
                    merge_line = line
                else:
                    if k.value in first:
                        where = format_loc((*path, k.value))
                        raise UsageError(
                            f"{source}:{line}: {where}: key given twice (first on line "
                            f"{first[k.value]}); keep one")
                    first[k.value] = line
                key = (*path, k.value)
                lines.setdefault(key, k.start_mark.line + 1)
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines.setdefault((*path, i), v.start_mark.line + 1)
                walk(v, (*path, i))

    walk(root, ())
    return lines


def _yaml_error(e: yaml.YAMLError, source: str, text: str) -> UsageError:
    mark = getattr(e, "problem_mark", None)
    where = f":{mark.line + 1}" if mark else ""
    if isinstance(e, yaml.reader.ReaderError):
        where = f":{text[: e.position].count(chr(10)) + 1}"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return UsageError(f"{source}{where}: not valid YAML ({problem}); fix the syntax")


def read_yaml(text: str, source: str) -> tuple[object, dict[Loc, int]]:
    """The data and the line of every key path, or one UsageError line."""
    try:
        loader = _Loader(text)  # refuses control characters already
        try:
            root = loader.get_single_node()
            if root is None:
                return None, {}
            _check_expansion(root, source)
            lines = _walk_lines(root, source)
            return loader.construct_document(root), lines
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise _yaml_error(e, source, text) from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to be a pool config; flatten it") from None


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_<-]{1,64}")


def format_loc(loc: Loc) -> str:
    """A key path as messages write it: pools[0].serving.port; a key that is not a plain
    name is quoted (['a\\nb']), so a message stays one line whatever the file holds."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(part):
            out += f"[{shown(part)}]"
        else:
            out += f".{part}" if out else part
    return out


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of `loc`, or of its nearest parent written in the file."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def shown(value: object) -> str:
    """A value as error messages quote it: repr, cut short (it may be huge or hostile)."""
    if isinstance(value, bool):
        return str(value).lower()  # as YAML writes it
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."
