"""resolve_target / resolve_targets: the file, endpoints, targets and ops a cloud command
works with, resolved once from -f, --pool, --cloud and --sandbox."""

from __future__ import annotations

import pytest

from poolctl.cloud import Cloud
from poolctl.commands import common
from poolctl.commands.common import resolve_target, resolve_targets
from poolctl.errors import UsageError
from tests.configs import pool_yaml, with_second_pool


@pytest.fixture
def two_pools(tmp_path):
    f = tmp_path / "poolctl.yaml"
    f.write_text(with_second_pool(pool_yaml()))
    return f


def test_one_pool_on_the_cloud_given(two_pools, monkeypatch):
    made = []
    monkeypatch.setattr(common, "get_ops", lambda cloud, endpoints, contact_email=None:
                        made.append(cloud) or "ops")
    ctx = resolve_target(two_pools, "chat-b", Cloud.gcp, False)
    assert (ctx.pool.name, ctx.cloud, ctx.target.cloud) == ("chat-b", Cloud.gcp, Cloud.gcp)
    assert ctx.path == two_pools
    assert made == []  # no ops until a command uses them
    assert (ctx.ops, ctx.ops, made) == ("ops", "ops", [Cloud.gcp])  # made once
    assert ctx.hint("rollout status") == (
        f"poolctl rollout status --cloud gcp -f {two_pools} --pool chat-b")


def test_several_pools_need_pool(two_pools):
    with pytest.raises(UsageError, match="--pool: this acts on one pool, the file gives "
                                         "chat-70b, chat-b"):
        resolve_target(two_pools, None, Cloud.aws, False)


def test_both_placements_need_cloud(two_pools):
    with pytest.raises(UsageError, match="--cloud: the selected pools have aws and gcp"):
        resolve_targets(two_pools, None, None, False)


def test_every_selected_pool_of_one_cloud(two_pools):
    ctx = resolve_targets(two_pools, None, Cloud.aws, False, contact_email="a@b.c")
    assert [t.pool.name for t in ctx.targets] == ["chat-70b", "chat-b"]
    assert {t.cloud for t in ctx.targets} == {ctx.cloud} == {Cloud.aws}
    assert ctx.contact_email == "a@b.c"
