"""Capacity held vs hoped for, and the fixed/marginal split of the cost (issue 21, part 5):
plan's figures, the warm-state rule's words and simulate's bill, worked out by hand."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.base import NodePhase, NodeState, PoolStatus
from poolctl.config import parse_config
from poolctl.servingmodel import replica_model
from poolctl.simulate import Autoscale, simulate, summary
from poolctl.sizing import cost_split, held_capacity, plan_pool
from poolctl.traces import synthetic
from tests.configs import pool_yaml
from tests.unit.test_capacity_config import capacity, error_of
from tests.unit.test_rules import findings
from tests.unit.test_runtime_math import FakeOps, group, llama, own_home  # noqa: F401

P5 = 55.04  # the catalog's p5.48xlarge On-Demand price per hour in us-east-1


def with_reserved(n: int, **kw) -> str:
    return pool_yaml(extra_aws=f"      capacity: {{reserved_nodes: {n}}}\n", **kw)


@pytest.mark.parametrize(("running", "stopped", "reserved", "held", "hoped"), [
    (1, 2, 0, 1, 2),  # nothing reserved: the stopped nodes are hoped for
    (1, 2, 2, 2, 1),  # the running node takes 1 of 2 reserved; 1 left for a stopped one
    (1, 2, 5, 3, 0),  # room for every stopped node (2 of the 4 left)
    (3, 0, 1, 3, 0),  # running nodes hold capacity whatever is reserved
    (4, 2, 3, 4, 2),  # the reservation is all taken by running nodes
])
def test_held_and_hoped(running, stopped, reserved, held, hoped):
    h = held_capacity(running, stopped, reserved)
    assert (h.held_nodes, h.hoped_nodes) == (held, hoped)
    assert h.held_nodes + h.hoped_nodes == running + stopped


def test_cost_split_bills_max_of_reserved_and_running():
    # 3 reserved, 1 running at the minimum, 6 at max, $10/h: fixed max(3, 1) = 3 nodes =
    # $30/h, 2 of them idle; at max 6 - 3 = 3 On-Demand nodes beyond = $30/h more.
    c = cost_split(1, 6, 3, 10.0)
    assert (c.fixed_nodes, c.fixed_per_hour, c.reserved_idle_nodes) == (3, 30.0, 2)
    assert (c.marginal_per_node_hour, c.marginal_at_max_per_hour) == (10.0, 30.0)
    # A reservation above the peak: all fixed, nothing marginal.
    assert cost_split(1, 6, 8, 10.0).marginal_at_max_per_hour == 0.0


def test_example_plan_without_a_reservation():
    # min 4 replicas / 4 per node = 1 node running; warm 8 / 4 = 2 nodes stopped; max 6.
    p = plan_pool(parse_config(pool_yaml()).pools[0], "aws")
    assert (p.capacity.held_nodes, p.capacity.hoped_nodes) == (1, 2)
    # fixed: 1 node x $55.04; marginal at max: (6 - 1) x $55.04 = $275.20
    assert p.cost_split_usd.fixed_per_hour == pytest.approx(P5)
    assert p.cost_split_usd.marginal_at_max_per_hour == pytest.approx(5 * P5)
    assert p.cost_per_hour_usd == {"min": pytest.approx(P5), "max": pytest.approx(6 * P5)}


def test_example_plan_with_a_reservation_of_two():
    p = plan_pool(parse_config(with_reserved(2)).pools[0], "aws")
    # 2 reserved: 1 taken by the running node, 1 keeps room for a stopped one: held 2,
    # hoped 1. Fixed max(2, 1) = 2 nodes = $110.08; at max (6 - 2) x $55.04 = $220.16.
    assert (p.capacity.held_nodes, p.capacity.hoped_nodes) == (2, 1)
    assert p.cost_split_usd.fixed_per_hour == pytest.approx(2 * P5)
    assert p.cost_split_usd.reserved_idle_nodes == 1
    assert p.cost_split_usd.marginal_at_max_per_hour == pytest.approx(4 * P5)
    assert p.cost_per_hour_usd["min"] == pytest.approx(2 * P5)  # the reservation is paid


def test_running_warm_nodes_are_held_and_fixed():
    p = plan_pool(parse_config(pool_yaml(warm_state="running")).pools[0], "aws")
    # 1 + 2 running warm = 3 held, 0 hoped; fixed 3 x $55.04; at max 6 + 2 = 8 running:
    # 8 - 3 = 5 beyond.
    assert (p.capacity.held_nodes, p.capacity.hoped_nodes) == (3, 0)
    assert p.cost_split_usd.fixed_per_hour == pytest.approx(3 * P5)
    assert p.cost_split_usd.marginal_at_max_per_hour == pytest.approx(5 * P5)


def hoped_findings(text: str) -> list:
    return [f for f in findings(text) if f.check == "warm-state" and "hoped for" in f.message]


def test_warm_state_rule_says_stopped_nodes_are_hoped_for():
    (f,) = hoped_findings(pool_yaml(with_gcp=False))
    assert f.severity == "info" and f.key == "pools[0].warm_pool.state"
    assert f.message.startswith("2 stopped warm node(s) are capacity hoped for, not held")
    assert "aws.capacity.reserved_nodes" in f.hint


@pytest.mark.parametrize("text", [
    pool_yaml(with_gcp=False, warm_state="running"),  # running: held
    with_reserved(3, with_gcp=False),  # 1 running + room for the 2 stopped
])
def test_no_hoped_for_finding_when_the_capacity_is_held(text):
    assert hoped_findings(text) == []


def test_reserved_nodes_refused_with_preference_none():
    msg = error_of(capacity("{preference: none, reserved_nodes: 1}"))
    assert " pools[0].aws.capacity.reserved_nodes: " in msg and "no node is reserved" in msg


# ------------------------------------------------------------------ simulate's bill

@pytest.fixture(scope="module")
def model():
    return replica_model(parse_config(pool_yaml()).pools[0], "aws")


def test_simulate_fixed_replicas_bills_the_reservation(model):
    m = model
    tr = synthetic(0.5, 60, 1, 500, 50)
    plain = simulate(tr, m, replicas=4, replicas_per_node=4, price_per_node_hour=10.0)
    reserved = simulate(tr, m, replicas=4, replicas_per_node=4, price_per_node_hour=10.0,
                        reserved_nodes=3)
    h = plain.horizon_s
    assert reserved.horizon_s == h
    # 1 node running, 3 reserved: billed max(3, 1) = 3 nodes over the horizon, all fixed.
    c0, c3 = summary(plain, 2.0).cost, summary(reserved, 2.0).cost
    assert c0.usd == pytest.approx(round(1 * h / 3600 * 10.0, 2))
    assert c3.usd == pytest.approx(round(3 * h / 3600 * 10.0, 2))
    assert c3.marginal_usd == 0 and c3.fixed_usd_per_hour == pytest.approx(30.0)
    assert c3.reserved_nodes == 3


def test_simulate_autoscaled_split_sums_and_reservation_absorbs_scale_out(model):
    # A burst that scales 1 node out to several: without a reservation the extra node-hours
    # are marginal; with 6 reserved (the max) every node runs inside it: nothing marginal.
    tr = synthetic(30.0, 600, 2, 1000, 200)
    sc = Autoscale(replicas_per_node=4, min_nodes=1, max_nodes=6, warm_nodes=0,
                   warm_start_s=60, cold_start_s=60, queue_target=4,
                   scale_down_stabilization_s=900, scale_in_cooldown_s=300,
                   warm_running=False)
    plain = summary(simulate(tr, model, scale=sc, price_per_node_hour=10.0), 2.0).cost
    held = summary(simulate(tr, model, scale=sc, price_per_node_hour=10.0,
                            reserved_nodes=6), 2.0).cost
    assert plain.marginal_usd > 0
    assert plain.fixed_usd + plain.marginal_usd == pytest.approx(plain.usd, abs=0.011)
    assert held.marginal_usd == 0 and held.fixed_usd_per_hour == pytest.approx(60.0)
    assert held.usd >= plain.usd  # an idle reservation is paid
    assert plain.usd_per_1m_output_tokens is not None
    out = plain.usd / plain.usd_per_1m_output_tokens  # millions of output tokens
    assert plain.fixed_usd_per_1m_output_tokens == pytest.approx(plain.fixed_usd / out,
                                                                 rel=0.01)


# ------------------------------------------------------------------ warm and status

def test_warm_says_stopped_nodes_are_hoped_for_and_running_ones_held():
    cfg, pool = llama()
    ops = FakeOps(group(), granted=10_000)
    # 12 replicas = 3 stopped warm nodes beside 1 running: 1 held, 3 hoped for.
    r = runtime.warm(cfg, pool, "aws", ops, 12)
    assert (r.capacity.held_nodes, r.capacity.hoped_nodes) == (1, 3)
    assert r.capacity_line.startswith("chat-70b: capacity: 1 node(s) held (1 running); 3 hoped "
                                      "for (stopped warm nodes without a reservation")
    # --running: minimum 1 + 3 = 4 in service; the 3 warm nodes set before stay stopped.
    r = runtime.warm(cfg, pool, "aws", ops, 12, running=True)
    assert (r.capacity.held_nodes, r.capacity.hoped_nodes) == (4, 3)


def test_warm_counts_reserved_room_as_held():
    cfg = parse_config(with_reserved(4))
    ops = FakeOps(group(), granted=10_000)
    # 1 running + 3 stopped, 4 reserved: 3 of them left for the stopped nodes: all held.
    r = runtime.warm(cfg, cfg.pools[0], "aws", ops, 12)
    assert (r.capacity.held_nodes, r.capacity.hoped_nodes) == (4, 0) and r.capacity_line == ""


def node(i: int, state: str, phase: NodePhase) -> NodeState:
    return NodeState(id=f"i-{i}", state=state, phase=phase)


def test_status_holds_running_and_warmed_running_not_warmed_stopped():
    nodes = [node(1, "InService", "in_service"), node(2, "Pending", "pending"),
             node(3, "Warmed:Running", "warm"), node(4, "Warmed:Stopped", "warm"),
             node(5, "Warmed:Stopped", "warm"), node(6, "Terminating", "terminating"),
             # a GCE standby VM, stopped
             node(7, "STOPPED/NONE", "warm")]
    s = PoolStatus(pool="chat-70b", cloud=Cloud.aws, group=group(), replicas_per_node=4,
                   nodes=nodes, rollout=None, queue_per_replica=None, reserved_nodes=4)
    # up: 1, 2, 3 = 3; stopped warm: 4, 5, 7 = 3; 4 reserved - 3 up = room for 1 of them.
    assert s.to_json()["capacity"] == {"running_nodes": 3, "stopped_nodes": 3,
                                       "reserved_nodes": 4, "held_nodes": 4, "hoped_nodes": 2,
                                       "capacity_block": None}


def test_a_block_pool_says_its_nodes_are_held_by_the_block_in_plan_and_status():
    block = "cr-0123456789abcdef0"
    cfg = parse_config(pool_yaml(
        warm=0, extra_aws=f"      capacity: {{capacity_block: {block}}}\n"))
    p = plan_pool(cfg.pools[0], Cloud.aws)
    # min 4 replicas / 4 per node = 1 running node, no warm pool: 1 held, 0 hoped.
    assert (p.capacity.held_nodes, p.capacity.hoped_nodes, p.capacity.capacity_block) == (
        1, 0, block)
    assert f"every node in Capacity Block {block}" in p.capacity.words()
    # GCP has no Capacity Block: its plan of the same pool says nothing of one.
    assert plan_pool(cfg.pools[0], Cloud.gcp).capacity.capacity_block is None
    # status and warm say it in the same words (PoolStatus.held from the file's block).
    st = PoolStatus(pool="chat-70b", cloud=Cloud.aws, group=group(), replicas_per_node=4,
                    nodes=[node(1, "InService", "in_service")],
                    rollout=None, queue_per_replica=None, capacity_block=block)
    assert st.held().capacity_block == block and st.to_json()["capacity"]["capacity_block"] \
        == block
