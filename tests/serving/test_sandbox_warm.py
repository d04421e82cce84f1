"""The serving sandbox with a warm pool (one node in service, one stopped in the warm pool):
a node taken from the warm pool serves sooner than a new one, by the planned phases; a node
that cannot read its API key ABANDONs its launch hook, is replaced, and `status` says why.

Each test starts from the same state (`_settle`: one node serving, one Warmed:Stopped) and
returns the pool to it, so they run in any order."""

from __future__ import annotations

import pytest

from tests.plugins.sandbox import boto3_client, run_poolctl, terraform_missing
from tests.serving.pool import KEY, serving, serving_pool, wait_for
from tests.serving.standin import call

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 10.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # 4 replicas a node: one node in service, one warm (stopped), up to three. Scale-in waits
    # two hours of pool time (12 min here): only the tests change the group's size.
    with serving_pool(tmp_path_factory.mktemp("warm-home"), SPEED, min_replicas=4,
                      max_replicas=12, warm=4, warm_state="stopped", down_s=7200) as pool:
        yield pool


def _group(asg) -> str:
    [g] = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
    return str(g["AutoScalingGroupName"])


def _up(rep) -> set[str]:
    """Instances whose load balancer target HAProxy's health checks have brought UP."""
    return {i for lb in rep["load_balancers"] for h in lb["Health"].values()
            for i, st in h.items() if st == "UP"}


def _warm(asg, group) -> list[dict]:
    return asg.describe_warm_pool(AutoScalingGroupName=group)["Instances"]


def _settle(url, asg, group, desired):
    """Set the group's size; wait until exactly `desired` nodes serve (InService, running,
    UP behind the load balancer) and the warm pool holds one stopped node."""
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=desired)

    def settled():
        [g] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
            "AutoScalingGroups"]
        rep = serving(url)
        in_service = {i["InstanceId"] for i in g["Instances"]
                      if i["LifecycleState"] == "InService"}
        running = {n["InstanceId"] for n in rep["nodes"] if n["Running"]}
        return (len(g["Instances"]) == len(in_service) == desired
                and in_service == running == _up(rep)
                and [w["LifecycleState"] for w in _warm(asg, group)] == ["Warmed:Stopped"])

    wait_for(f"{desired} node(s) serving and one warm", settled, timeout=240, every=0.5)


def test_a_warm_pool_node_serves_sooner_than_a_new_one_by_the_planned_phases(served):
    url = served["url"]
    asg = boto3_client(url, "autoscaling")
    group = _group(asg)
    _settle(url, asg, group, 1)
    [warm] = [w["InstanceId"] for w in _warm(asg, group)]
    before = _up(serving(url))
    t0 = serving(url)["pool_seconds"]
    # Two more nodes at once: the warm pool's stopped node starts, a new one launches.
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=3)
    serves: dict[str, float] = {}

    def both():
        rep = serving(url)
        for inst in _up(rep) - before:
            serves.setdefault(inst, rep["pool_seconds"] - t0)
        return len(serves) == 2

    wait_for("the warm and the new node serving", both, timeout=150, every=0.1)
    assert warm in serves
    [new] = set(serves) - {warm}
    # The plan's phases for this pool (p5.48xlarge, Llama-3.1-70B BF16, not pre-pulled), as
    # the boot script runs them (the image pull beside the weights fetch), then the target
    # group's two health checks 15 s apart (UP after 15-30 s: the first check falls anywhere
    # in its interval):
    #   new:  boot 120 + max(image 120, weights 45.2) + load 35.3 + engine 90 = 365.3 s
    #   warm: boot  60 + image on its root volume 0 + weights 45.2 + 35.3 + 90 = 230.5 s
    # (its NVMe cache came back empty: the weights are fetched again).
    cold_s, warm_s = 365.3, 230.5
    # Above each: what the real processes add (bash, the aws CLI's start-ups) times the speed.
    assert cold_s + 15 <= serves[new] <= cold_s + 30 + 40, serves
    assert warm_s + 15 <= serves[warm] <= warm_s + 30 + 40, serves
    # Sooner by 134.8 s of pool time, give or take 15 s (each node's first health check
    # falls anywhere in its own 15-s interval) and 20 s of that overhead's jitter (2 wall s at
    # speed 10; CI's four workers on two cores measured 105.4 s once, warm 281.2 / new 386.6).
    assert cold_s - warm_s - 35 <= serves[new] - serves[warm] <= cold_s - warm_s + 35, serves
    _settle(url, asg, group, 1)


def test_a_node_that_cannot_read_its_api_key_is_abandoned_and_replaced(served):
    url = served["url"]
    asg, sm = boto3_client(url, "autoscaling"), boto3_client(url, "secretsmanager")
    group = _group(asg)
    _settle(url, asg, group, 1)
    arn = served["secret"]
    sm.delete_secret(SecretId=arn, RecoveryWindowInDays=7)  # scheduled, restorable
    try:
        [node] = _up(serving(url))
        asg.terminate_instance_in_auto_scaling_group(InstanceId=node,
                                                     ShouldDecrementDesiredCapacity=False)

        def failed():
            return [n for n in serving(url)["nodes"] if n["Failure"]]

        # The replacement (the warm node, started) reads the key just before the engine
        # starts: AWS's error ends the boot, the hook is ABANDONed, the group ends that node
        # and launches another, which fails the same way while the secret stays deleted.
        first = wait_for("a failed boot", failed, timeout=120)
        assert first[0]["Failure"] == (
            f"api key: cannot read secret {arn}: An error occurred (InvalidRequestException) "
            "when calling the GetSecretValue operation: You can't perform this operation on "
            "the secret because it was marked for deletion.")
        wait_for("a replacement that failed too", lambda: len(failed()) >= 2, timeout=120)
        wait_for("the failed nodes ended by the group",
                 lambda: not any(n["Running"] for n in failed()), timeout=60)
        r = run_poolctl(served["home"], "status", "--sandbox", "-f", str(served["cfg"]),
                        "--cloud", "aws")
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if "boot failed:" in ln]
        assert len(lines) == 1 and f"api key: cannot read secret {arn}" in lines[0], r.stdout
        assert KEY not in r.stdout  # the failure names the secret, never a key
    finally:
        sm.restore_secret(SecretId=arn)
    # The secret back: the next replacement boots and serves through the load balancer.
    wait_for("a node serving again", lambda: call(served["lb"], "/v1/models", key=KEY)[0]
             == 200, timeout=180)
    _settle(url, asg, group, 1)
