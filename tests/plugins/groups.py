"""How a parallel run (`pytest -n N --dist loadgroup`, what scripts/test does) spreads the
tests over its workers, and the guard that refuses a run where that would go wrong.

Groups: a test module is one group, run on one worker in file order, because its tests may
build on each other (deploy, inspect, roll out ...) and share module-scoped fixtures. A test
marked `standalone` builds on no other test of its module: it is a group of its own, which
any worker may take. An explicit `xdist_group` mark names the group itself.

Order, declared rather than measured: first the groups that deploy to the sandbox (a test
marked `e2e`, or using `deployed_pool`), those with the most tests first; then the others in
collection order. Why: a deploy spends minutes waiting on the AWS provider's fixed delays,
and started first those waits overlap the other groups' CPU work; a group that empties the
sandbox (`sandbox_reset`) then no longer costs a pool user on its worker a new deploy. Most
tests first among them because xdist gives a worker its next group as soon as it has two
tests or fewer left: a chain of one or two long tests takes the next group with it, so it
had better come last. Beyond that xdist balances by itself, which works because the long
chains are few and short enough, and the rest are many small groups.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "standalone: builds on no other test of its module: a group of its own "
        "under --dist loadgroup, which any worker may run")
    if getattr(config.option, "numprocesses", None) and config.option.dist != "loadgroup":
        raise pytest.UsageError(
            f"--dist {config.option.dist}: this suite runs in parallel only with "
            "`--dist loadgroup` (scripts/test passes it): a module's tests build on each other")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # keep our order, not xdist's by group size


def group_of(item: pytest.Item) -> str:
    """The group of a test, in serial runs too: its `xdist_group` mark, else
    `module::test` for a `standalone` test, else its module (tests/ops/test_x.py ->
    ops/test_x)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    module = item.nodeid.split("::", 1)[0].removeprefix("tests/").removesuffix(".py")
    if item.get_closest_marker("standalone") is not None:
        return f"{module}::{getattr(item, 'originalname', item.name)}"
    return module


def _deploys(item: pytest.Item) -> bool:
    return (item.get_closest_marker("e2e") is not None
            or "deployed_pool" in getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # a serial run keeps pytest's own order
    groups = {id(item): group_of(item) for item in items}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups[id(item)]))
    deploying = {groups[id(item)] for item in items if _deploys(item)}
    size = Counter(groups.values())
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(groups[id(item)], len(first_seen))

    def rank(item: pytest.Item) -> tuple[int, int]:
        group = groups[id(item)]
        if group in deploying:
            return 0, -size[group]
        return 1, first_seen[group]

    items.sort(key=lambda item: (*rank(item), first_seen[groups[id(item)]]))  # stable


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """In the controller, as each xdist worker reports its tests: refuse to run unless xdist
    marked every one with its group (`nodeid@group`). Unmarked tests are scheduled one by
    one, and a module's chained tests (deploy, inspect, roll out ...) would run on different
    workers against different sandboxes: pytest 9.2 with xdist 3.8 does that
    (pytest-dev/pytest-xdist#1386; pyproject.toml keeps pytest below 9.2)."""
    if node.config.option.dist != "loadgroup":
        return
    # xdist's own test for a group (LoadGroupScheduling._split_scope): an "@" after any "]"
    lost = [nodeid for nodeid in ids if nodeid.rfind("@") <= nodeid.rfind("]")]
    if lost:
        pytest.exit(
            f"pytest-xdist did not put {len(lost)} tests in their groups (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together (pytest-dev/pytest-xdist#1386);"
            " install the versions pyproject.toml allows (scripts/setup does)", returncode=2)
