"""One cost rule (issue 32): plan, deploy, status and simulate price a pool alike, with its
reservations, its running warm nodes and on a Capacity Block. Worked out by hand at the
catalog's p5.48xlarge price, $55.04 per node-hour, 4 replicas per node (TP 2):

| pool                                   | up at the minimum  | billed | $/h     |
|----------------------------------------|--------------------|--------|---------|
| min 1 node, 2 warm running, 3 reserved | 1 + 2 = 3          | 3      | 165.12  |
| min 1 node, 2 warm stopped, 5 reserved | 1 (stopped: 0)     | 5      | 275.20  |
| min 1 node, on a Capacity Block        | 1                  | 1      | 55.04   |

and at the maximum of 6 nodes: 6 + 2 = 8 -> 440.32; max(5, 6) = 6 -> 330.24; 6 -> 330.24.
Deploy priced the second pool at 55.04 before (it left the reservation out).
"""

from __future__ import annotations

import pytest

from poolctl.capacity import run_pool
from poolctl.cloud import Cloud
from poolctl.clouds.base import NodeState, PoolStatus
from poolctl.config import parse_config
from poolctl.deploy import pool_cost
from poolctl.simulate import summary
from poolctl.sizing import plan_pool
from poolctl.terraform import PlanSummary
from poolctl.traces import Trace
from tests.configs import pool_yaml
from tests.unit.test_runtime_math import group

P5 = 55.04
POOLS = {
    "reserved, warm running": (pool_yaml(warm_state="running", extra_aws=(
        "      capacity: {reserved_nodes: 3}\n")), 165.12, 440.32, "Warmed:Running"),
    "reserved beyond what runs": (pool_yaml(extra_aws=(
        "      capacity: {reserved_nodes: 5}\n")), 275.20, 330.24, "Warmed:Stopped"),
    "capacity block": (pool_yaml(warm=0, extra_aws=(
        "      capacity: {capacity_block: cr-0123456789abcdef0}\n")), 55.04, 330.24, None),
}


@pytest.mark.parametrize("name", POOLS)
def test_plan_deploy_status_and_simulate_agree(name):
    text, at_min, at_max, warm_state = POOLS[name]
    pool = parse_config(text).pools[0]
    plan = plan_pool(pool, Cloud.aws)
    assert plan.price_per_node_hour_usd == P5
    assert plan.cost_per_hour_usd == {"min": at_min, "max": at_max}

    deployed = pool_cost(pool, Cloud.aws, PlanSummary())
    assert (deployed["min"], deployed["max"]) == (at_min, at_max)

    nodes = [NodeState(id="i-1", state="InService", phase="in_service")]
    if warm_state:
        nodes += [NodeState(id=f"i-w{k}", state=warm_state, phase="warm") for k in range(2)]
    st = PoolStatus(pool=pool.name, cloud=Cloud.aws, group=group(), replicas_per_node=4,
                    nodes=nodes, rollout=None, queue_per_replica=None,
                    reserved_nodes=plan.capacity.reserved_nodes,
                    capacity_block=plan.capacity.capacity_block,
                    price_per_node_hour_usd=plan.price_per_node_hour_usd)
    assert st.cost_per_hour_usd() == at_min
    assert st.to_json()["cost_per_hour_usd"] == at_min

    # No traffic for an hour: the autoscaled pool stays at its minimum, billed as above.
    quiet = Trace("quiet", [3600.0], [10], [1])
    cost = summary(run_pool(pool, Cloud.aws, quiet, autoscale=True), 60.0).cost
    assert cost.fixed_usd_per_hour + cost.marginal_usd_per_hour == pytest.approx(at_min,
                                                                                 abs=0.02)
