"""The order a run takes its tests in; nothing depends on it but the wall time.

Every test stands alone: whatever it reads of a deployed pool comes from a fixture (a
module's, or a snapshot restored for it), never from a test before it, so any order and
any split over workers passes. `scripts/test` runs `-n N --dist loadscope
--no-loadscope-reorder`: pytest-xdist gives each worker whole modules, so a module's
fixtures (a deployed pool, a sandbox of its own) are made once, on one worker.

Order, declared rather than measured: first the modules that deploy to the sandbox (a test
marked `e2e`, or using `deployed_pool`), those with the most tests first; then the others in
collection order. Why: a deploy spends minutes waiting on the AWS provider's fixed delays,
and started first those waits overlap the other modules' CPU work. Most tests first among
them because xdist gives a worker its next module as soon as it has two tests or fewer left:
a module of one or two long tests takes the next module with it, so it had better come last.

`POOLCTL_TEST_ORDER=reverse` runs each module's tests last to first: the check that no test
leans on one before it (docs/testing.md).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

ORDER_ENV = "POOLCTL_TEST_ORDER"


def module_of(item: pytest.Item) -> str:
    """The module of a test, as the suite names it: tests/ops/test_x.py -> ops/test_x."""
    return item.nodeid.split("::", 1)[0].removeprefix("tests/").removesuffix(".py")


def _deploys(item: pytest.Item) -> bool:
    return (item.get_closest_marker("e2e") is not None
            or "deployed_pool" in getattr(item, "fixturenames", ()))


def pytest_configure(config: pytest.Config) -> None:
    order = os.environ.get(ORDER_ENV, "")
    if order not in ("", "reverse"):
        raise pytest.UsageError(f"{ORDER_ENV}={order!r}: the one value is `reverse`")


@pytest.hookimpl(trylast=True)  # after other plugins deselected or added tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = {id(item): module_of(item) for item in items}
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(modules[id(item)], len(first_seen))
    position = {id(item): i for i, item in enumerate(items)}
    reverse = os.environ.get(ORDER_ENV) == "reverse"
    deploying = {modules[id(item)] for item in items if _deploys(item)}
    size = Counter(modules.values())

    def key(item: pytest.Item) -> tuple[int, int, int, int]:
        module = modules[id(item)]
        rank = (0, -size[module]) if module in deploying else (1, 0)
        within = -position[id(item)] if reverse else position[id(item)]
        return (*rank, first_seen[module], within)

    if hasattr(config, "workerinput") or reverse:  # a plain serial run keeps pytest's order
        items.sort(key=key)
