"""The README and docs/ stay true to the repository: links resolve, commands exist.

Offline and cheap: the Markdown files are read as text, the commands are looked up in the
CLI's click tree (nothing runs), the config keys come from `poolctl schema`'s model.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from poolctl.app import command_tree
from poolctl.config import json_schema

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS, ROOT / "images" / "README.md",
         *sorted((ROOT / "examples").glob("*/README.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
# [text](target) and ![alt](target); the target ends at the first space or ")".
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, inline code removed."""
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield n, INLINE_CODE.sub("", line)


def code_blocks(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of each fenced block."""
    start, lang = 0, ""
    lines: list[str] = []
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line.strip())
        if m and not fenced:
            fenced, start, lang, lines = True, n + 1, line.strip()[3:].strip(), []
        elif m:
            fenced = False
            yield start, lang, lines
        elif fenced:
            lines.append(line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def links(path: Path) -> Iterator[tuple[int, str]]:
    for n, line in prose_lines(path):
        for m in LINK.finditer(line):
            yield n, m.group(1)


def test_every_page_is_found():
    assert README.is_file() and DOCS, "README.md and docs/*.md are the pages checked here"


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `page` whose file (or heading) is not in `root`."""
    bad = []
    for n, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.name}:{n}: {target}"
        if not dest.is_relative_to(root):
            bad.append(f"{where}: outside the repository")
        elif not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading #{anchor} in {dest.name}")
    return bad


def test_the_link_check_finds_broken_links(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## The `x --y` part\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/b.md#the-x---y-part) [gone](docs/c.md) `[code](nowhere.md)`\n"
                    "[no anchor](docs/b.md#z) [web](https://example.com/x) [up](../x.md)\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert link_problems(page, tmp_path) == [
        "README.md:1: docs/c.md: no such file",
        "README.md:2: docs/b.md#z: no heading #z in b.md",
        "README.md:2: ../x.md: outside the repository",
    ]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path):
    assert link_problems(page) == []


def test_the_slug_matches_githubs_for_the_headings_used_here():
    assert slug("`plan --traffic`") == "plan---traffic"
    assert slug("Starting a file: `init` and model presets") == \
        "starting-a-file-init-and-model-presets"
    assert slug("### `pools.aws.network`".lstrip("# ")) == "poolsawsnetwork"


def test_readme_stays_an_entry_point():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_machine_paths(page: Path):
    hits = [f"{rel(page)}:{n}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if re.search(r"/work/|/home/[a-z]|/root/", line)]
    assert hits == []


# ---------------------------------------------------------------------------------------
# Commands shown in the docs exist, with the flags they are shown with


# typer builds a click tree (with the click it vendors): groups have `commands`, options have
# `opts` and `secondary_opts`.
ROOT_CMD: Any = command_tree()


def command_lines(page: Path) -> Iterator[tuple[int, str]]:
    """Each shell command in a bash/console block (continuations joined, comments and
    prompts dropped), and each inline code span of prose that starts with `poolctl `."""
    for start, lang, lines in code_blocks(page):
        if lang not in ("bash", "console", "sh", "shell"):
            continue
        joined: list[tuple[int, str]] = []
        for i, line in enumerate(lines):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((start + i, line))
        for n, line in joined:
            if lang == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            yield n, re.sub(r"\s#\s.*$", "", line)
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in re.finditer(r"`(poolctl [^`]+)`", line):
            yield n, m.group(1)


def poolctl_invocations(line: str) -> Iterator[list[str]]:
    for part in re.split(r"\s(?:&&|;|\|\||\|)\s|&$", line):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        for i, w in enumerate(words):
            if w == "poolctl":
                yield words[i + 1:]
                break


def resolve(words: list[str]) -> tuple[Any, list[str], str | None]:
    """The command the words name, the rest of the words, and a problem if any."""
    cmd = ROOT_CMD
    rest = list(words)
    while rest and hasattr(cmd, "commands"):
        word = rest[0]
        if word.startswith(("-", "<")) or word in ("/", "|", "..."):
            break  # a flag, or a placeholder like `poolctl <command> --help`
        sub = cmd.commands.get(word)
        if sub is None:
            return cmd, rest, f"no command {word!r} in `{cmd.name}`"
        cmd, rest = sub, rest[1:]
    return cmd, rest, None


def option_names(cmd: Any) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        if p.param_type_name == "option":
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


ROOT_OPTIONS = option_names(ROOT_CMD) | {"--install-completion", "--show-completion"}


def command_problems(line: str) -> list[str]:
    """What is wrong with the poolctl commands of one shell line: an unknown (sub)command or
    a flag the command does not take."""
    out = []
    for words in poolctl_invocations(line):
        cmd, rest, problem = resolve(words)
        if problem:
            out.append(problem)
            continue
        known = option_names(cmd) | (ROOT_OPTIONS if cmd is ROOT_CMD else set())
        for w in rest:
            flag = w.strip("[]()").split("=")[0]
            if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in known:
                out.append(f"`{cmd.name}` takes no {flag}")
    return out


def test_the_command_check_finds_wrong_commands_and_flags():
    assert command_problems("poolctl rollout start --cloud aws --image X --no-wait") == []
    assert command_problems("poolctl warm --replicas=8 -f F --json") == []
    assert command_problems("source scripts/env.sh && poolctl sandbox start --port 0") == []
    assert command_problems("poolctl rollout begin --cloud aws") == [
        "no command 'begin' in `rollout`"]
    assert command_problems("poolctl status --follow") == ["`status` takes no --follow"]
    assert command_problems("cd x && poolctl logs -F --since 2h --wait") == [
        "`logs` takes no --wait"]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_commands_shown_exist_with_their_flags(page: Path):
    bad = [f"{rel(page)}:{n}: {line.strip()}: {problem}"
           for n, line in command_lines(page) for problem in command_problems(line)]
    assert bad == []


def leaf_commands(cmd: Any, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from leaf_commands(sub, (*prefix, name))
    else:
        yield " ".join(prefix)


def test_commands_page_names_every_command():
    text = (ROOT / "docs" / "commands.md").read_text()
    assert [c for c in leaf_commands(ROOT_CMD) if f"poolctl {c}" not in text] == []


# ---------------------------------------------------------------------------------------
# docs/config.md has a row for every key of the schema


def schema_sections() -> dict[str, set[str]]:
    """{section path: its keys}, e.g. {"pools.aws.network": {"vpc_id", ...}}."""
    schema = json_schema()
    defs: dict[str, Any] = schema.get("$defs", {})
    out: dict[str, set[str]] = {}

    def refs(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if "$ref" in node:
            yield defs[node["$ref"].rsplit("/", 1)[-1]]
        for sub in node.get("anyOf", []) + node.get("allOf", []) + node.get("oneOf", []):
            yield from refs(sub)
        if "items" in node:
            yield from refs(node["items"])

    def walk(node: dict[str, Any], path: str) -> None:
        props = node.get("properties", {})
        out[path] = set(props)
        for key, sub in props.items():
            for target in refs(sub):
                walk(target, f"{path}.{key}" if path else key)

    walk(schema, "")
    return out


def config_doc_sections() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    section = None
    for line in (ROOT / "docs" / "config.md").read_text().splitlines():
        if m := re.match(r"^### (?:`([\w.]+)`|Top level)\s*$", line):
            section = m.group(1) or ""
            out[section] = set()
        elif line.startswith("## "):
            section = None
        elif section is not None and (m := re.match(r"^\| `(\w+)` \|", line)):
            out[section].add(m.group(1))
    return out


def test_config_page_has_a_row_for_every_schema_key():
    want, have = schema_sections(), config_doc_sections()
    missing = sorted(f"{s}.{k}" if s else k for s, keys in want.items()
                     for k in keys - have.get(s, set()))
    extra = sorted(f"{s}.{k}" if s else k for s, keys in have.items()
                   for k in keys - want.get(s, set()))
    assert (missing, extra) == ([], []), "docs/config.md's key tables and `poolctl schema` differ"
