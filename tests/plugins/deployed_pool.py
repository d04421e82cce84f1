"""The example pool (examples/llama-70b-p5/poolctl.yaml) deployed to the session's sandbox,
for the tests of runtime commands (status, quota, warm, rollout ...).

Fixtures: `deployed_pool` (deploys it on first use; yields {"file", "asg", "region", "via"})
and `pool_keeper` (the `PoolKeeper` that owns it on this worker). Helpers: `deploy_with_boto3`
(the same resources without Terraform) and `empty_sandbox`.

A deploy takes minutes (the AWS provider's fixed waits), so a worker deploys the pool once,
keeps the sandbox's snapshot of it as deployed (with its Terraform state: `keep_snapshot`,
`restore_snapshot`, which other tests use for their own deployments too), and gives each
module that asks for it that pool again: a worker runs several modules in turn, and a
module's tests change the pool (each test sets up what it needs, never from another test).
"""

from __future__ import annotations

import shutil
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.config import load_config
from tests.plugins.order import module_of
from tests.plugins.sandbox import (
    REPO,
    boto3_client,
    run_poolctl,
    sandbox_admin,
    stand_in_ami,
    terraform_missing,
)

DEPLOYED_EXAMPLE = REPO / "examples" / "llama-70b-p5" / "poolctl.yaml"
DEPLOYED_REGION = "us-east-1"
SNAPSHOT = "deployed-pool"
# The user of a pool a test deployed and handed over (`PoolKeeper.adopt`): no module is
# named so, so the next module that asks for the pool starts from the snapshot.
HANDED_OVER = "(handed over)"


def _example_pool() -> tuple[Any, Any]:
    cfg = load_config(DEPLOYED_EXAMPLE)
    return cfg, cfg.pools[0]


class PoolKeeper:
    """The example pool of this worker's sandbox: where it is deployed, how (Terraform or
    boto3), and which test module used it last. One per session (`config.stash`): the
    `deployed_pool` fixture and the `pytest_runtest_setup` hook below share it."""

    def __init__(self) -> None:
        self.at: tuple[str, Path] | None = None  # (endpoint, POOLCTL_HOME) once in use
        self.via: str | None = None
        self.user: str | None = None  # the module whose tests used the pool last

    def first_use(self, endpoint: str, home: Path) -> dict[str, Any]:
        if self.at is None:  # else a test deployed the pool and handed it over
            self.at = (endpoint, home)
            # Modules that ran before on this worker may have left instances (quota in use).
            empty_sandbox(endpoint, home)
        return self.ensure()

    def adopt(self, endpoint: str, home: Path) -> None:
        """A test that deployed the example on an emptied sandbox and booted its nodes hands
        the pool over, as if the fixture had deployed it: the `deployed_pool` users on this
        worker start from its snapshot instead of deploying again (~95 s)."""
        self.at = (endpoint, home)
        self.user = HANDED_OVER
        self.ensure()  # finds it; records how it was made
        self._snapshot()

    def before_test(self, module: str) -> None:
        """A test of `module` asks for the pool: the first of its module gets it as deployed
        (restored from the snapshot, a second; a deploy only where a test wiped the
        sandbox)."""
        if self.at is not None:
            if self.user is not None and self.user != module and not self._restore():
                empty_sandbox(*self.at)
            self.ensure()
        self.user = module

    def fresh(self) -> None:
        """The pool as deployed again, for a test that changes it (a second or two): the
        module's tests then stand alone."""
        assert self.at is not None, "the pool is not in use yet"
        if not self._restore():
            empty_sandbox(*self.at)
        self.ensure()

    def ensure(self) -> dict[str, Any]:
        """Make sure the example pool exists in the sandbox; cheap when it does (one call).

        A new deployment also plays the nodes' boot scripts (completes the launch hook), as
        `poolctl sandbox boot-nodes` does: the group's node InService, the warm pool settled.
        """
        assert self.at is not None, "the pool is not in use yet"
        endpoint, home = self.at
        cfg, pool = _example_pool()
        name = naming.base(cfg, pool)
        if _pool_group(endpoint, name) is None:
            if terraform_missing() is None:
                _deploy_with_terraform(endpoint, home)
                self.via = "terraform"
            else:
                deploy_with_boto3(endpoint)
                self.via = "boto3"
            sandbox_admin(endpoint, "POST", "/_poolctl/lifecycle-actions",
                          {"AutoScalingGroupName": name, "LifecycleActionResult": "CONTINUE"})
            self._snapshot()
        elif self.via is None:  # deployed before the fixture ran (e.g. by the e2e test)
            stack = naming.stack_name(cfg, pool, Cloud.aws)
            state = home / "sandbox" / "state" / f"{stack}.tfstate"
            self.via = "terraform" if state.exists() else "boto3"
        return {"file": str(DEPLOYED_EXAMPLE), "asg": name, "region": DEPLOYED_REGION,
                "via": self.via}

    def _snapshot(self) -> None:
        assert self.at is not None
        keep_snapshot(*self.at, SNAPSHOT)

    def _restore(self) -> bool:
        assert self.at is not None
        return restore_snapshot(*self.at, SNAPSHOT)


def _kept(home: Path, name: str) -> Path:
    """Where the Terraform side of a snapshot's moment is kept (beside the home, so no test
    of the home's files sees it)."""
    return home.parent / f"{home.name}-{name}"


# What of POOLCTL_HOME goes with the sandbox's state: Terraform's states and the stacks'
# working folders (their init: lock file, provider links; a few hundred KB).
_TERRAFORM_PARTS = ("state", "deploy")


def keep_snapshot(endpoint: str, home: Path, name: str) -> None:
    """Keep the sandbox as it is now under `name`: its copy of itself, and the Terraform
    states and working folders that match it."""
    sandbox_admin(endpoint, "POST", "/_poolctl/snapshots", {"name": name})
    kept = _kept(home, name)
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    for part in _TERRAFORM_PARTS:
        if (home / "sandbox" / part).is_dir():
            shutil.copytree(home / "sandbox" / part, kept / part, symlinks=True)


def restore_snapshot(endpoint: str, home: Path, name: str) -> bool:
    """Put the sandbox and its Terraform side back as `keep_snapshot` kept them, in a
    second or two instead of a deploy's minutes; False if there is no such snapshot (a
    reset dropped it). What poolctl keeps of the pool's life (warm sizes, rollout records)
    goes: the pool is as deployed."""
    try:
        sandbox_admin(endpoint, "POST", f"/_poolctl/snapshots/{name}/restore")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return False
    kept = _kept(home, name)
    for part in _TERRAFORM_PARTS:
        shutil.rmtree(home / "sandbox" / part, ignore_errors=True)
        if (kept / part).is_dir():
            shutil.copytree(kept / part, home / "sandbox" / part, symlinks=True)
    for records in ("warm", "rollouts"):
        shutil.rmtree(home / records, ignore_errors=True)
    return True


_KEEPER = pytest.StashKey[PoolKeeper]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEEPER] = PoolKeeper()


@pytest.fixture(scope="session")
def pool_keeper(request: pytest.FixtureRequest) -> PoolKeeper:
    """This worker's `PoolKeeper` (a test that deploys the example itself hands it over)."""
    return request.config.stash[_KEEPER]


@pytest.fixture(scope="session")
def deployed_pool(pool_keeper: PoolKeeper, sandbox: str, sandbox_home: Path
                  ) -> Iterator[dict[str, Any]]:
    """The example pool deployed to the session sandbox.

    With Terraform and a provider mirror: `poolctl deploy --cloud aws --sandbox`; else the
    same tagged resources made with boto3. Yields {"file", "asg", "region", "via"}; its
    nodes have booted (1 InService, 2 Warmed:Stopped). Tests may change the pool; each
    module starts from it as deployed, and a test that wipes the sandbox or destroys the
    stack does not break later users: the pool is re-created for the next one.
    """
    yield pool_keeper.first_use(sandbox, Path(sandbox_home))


@pytest.hookimpl(tryfirst=True)  # before the module's fixtures see the pool
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "deployed_pool" in getattr(item, "fixturenames", ()):
        item.config.stash[_KEEPER].before_test(module_of(item))


def empty_sandbox(endpoint: str, home: Path) -> None:
    """Empty the emulator and drop what poolctl keeps of the pool under POOLCTL_HOME (the
    sizes `warm` set survive a deploy, rollout records steer the next rollout): the next
    `deployed_pool` user gets the pool deployed as the file describes it."""
    sandbox_admin(endpoint, "POST", "/moto-api/reset")
    for kept in ("warm", "rollouts"):
        shutil.rmtree(home / kept, ignore_errors=True)


def _pool_group(endpoint: str, name: str) -> dict | None:
    asg = boto3_client(endpoint, "autoscaling", DEPLOYED_REGION)
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return groups[0] if groups else None


def _forget_stale_state(endpoint: str, home: Path, stack: str, lb_name: str) -> None:
    """After moto's reset the Terraform state names resources that no longer exist: drop it
    (the same cleanup `poolctl sandbox stop` does), so the next deploy starts clean."""
    elbv2 = boto3_client(endpoint, "elbv2", DEPLOYED_REGION)
    names = {lb["LoadBalancerName"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]}
    if lb_name in names:
        return  # only some resources went: Terraform's refresh re-creates what is missing
    shutil.rmtree(home / "sandbox" / "deploy" / stack, ignore_errors=True)
    (home / "sandbox" / "state" / f"{stack}.tfstate").unlink(missing_ok=True)


def _deploy_with_terraform(endpoint: str, home: Path) -> None:
    cfg, pool = _example_pool()
    _forget_stale_state(endpoint, home, naming.stack_name(cfg, pool, Cloud.aws),
                        naming.short(naming.base(cfg, pool), 32))
    res = run_poolctl(home, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve",
                      "-f", str(DEPLOYED_EXAMPLE), "--out", str(home / "cdktf.out"))
    if res.returncode != 0:
        raise RuntimeError(f"poolctl deploy failed (exit {res.returncode}): "
                           f"{res.stderr[-3000:]}")


def deploy_with_boto3(endpoint: str) -> None:
    """The resources the AWS stack creates that runtime commands look at, made directly:
    network, internal load balancer and target group, launch template (IMDSv2, no public
    IP, encrypted root), the group with its launch hook and warm pool, all tagged."""
    from poolctl.sizing import plan_pool  # 1.6 s of imports (it reaches the cloud SDKs)

    cfg, pool = _example_pool()
    plan = plan_pool(pool, Cloud.aws)
    name = naming.base(cfg, pool)
    tags = naming.aws_tags(cfg, pool)
    kv = [{"Key": k, "Value": v} for k, v in tags.items()]

    ec2, elbv2, asg = (boto3_client(endpoint, service, DEPLOYED_REGION)
                       for service in ("ec2", "elbv2", "autoscaling"))
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": kv + [{"Key": "Name", "Value": name}]}])["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{16 * i}.0/20",
                          AvailabilityZone=f"{DEPLOYED_REGION}{zone}",
                          TagSpecifications=[{"ResourceType": "subnet", "Tags": kv}]
                          )["Subnet"]["SubnetId"]
        for i, zone in enumerate("ab")
    ]
    lb_sg = ec2.create_security_group(GroupName=f"{name}-lb", VpcId=vpc,
                                      Description=f"poolctl {name}: clients to the LB")["GroupId"]
    node_sg = ec2.create_security_group(GroupName=f"{name}-nodes", VpcId=vpc,
                                        Description=f"poolctl {name}: nodes")["GroupId"]
    ec2.create_tags(Resources=[lb_sg, node_sg], Tags=kv)
    short = naming.short(name, 32)
    lb = elbv2.create_load_balancer(Name=short, Subnets=subnets, SecurityGroups=[lb_sg],
                                    Scheme="internal", Type="application", Tags=kv
                                    )["LoadBalancers"][0]
    tg = elbv2.create_target_group(
        Name=short, Protocol="HTTP", Port=pool.serving.port, VpcId=vpc, TargetType="instance",
        HealthCheckPath=pool.serving.health_path, HealthCheckProtocol="HTTP", Tags=kv,
    )["TargetGroups"][0]
    elbv2.create_listener(LoadBalancerArn=lb["LoadBalancerArn"], Protocol="HTTP", Port=80,
                          DefaultActions=[{"Type": "forward",
                                           "TargetGroupArn": tg["TargetGroupArn"]}])
    ami = stand_in_ami(ec2)
    lt = ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={
            "ImageId": ami, "InstanceType": pool.aws.instance_type,
            "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required",
                                "HttpPutResponseHopLimit": 1},
            "NetworkInterfaces": [{"DeviceIndex": 0, "AssociatePublicIpAddress": False,
                                   "Groups": [node_sg], "DeleteOnTermination": True}],
            "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
                "VolumeSize": pool.aws.root_volume_gb, "VolumeType": "gp3",
                "Encrypted": True, "DeleteOnTermination": True}}],
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": kv + [{"Key": "Name", "Value": name}]}
                for kind in ("instance", "volume")
            ],
        },
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": kv}],
    )["LaunchTemplate"]
    cold = int(plan.start_seconds["cold"])
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=plan.nodes.min,
        MaxSize=plan.nodes.max, DesiredCapacity=plan.nodes.min,
        VPCZoneIdentifier=",".join(subnets), TargetGroupARNs=[tg["TargetGroupArn"]],
        HealthCheckType="ELB", HealthCheckGracePeriod=cold, DefaultInstanceWarmup=cold,
        LaunchTemplate={"LaunchTemplateId": lt["LaunchTemplateId"], "Version": "$Latest"},
        LifecycleHookSpecificationList=[{
            "LifecycleHookName": naming.LIFECYCLE_HOOK,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
            "DefaultResult": "ABANDON", "HeartbeatTimeout": min(7200, max(600, 2 * cold)),
        }],
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True}
              for k, v in {**tags, "Name": name}.items()],
    )
    if plan.nodes.warm:
        asg.put_warm_pool(
            AutoScalingGroupName=name, MinSize=plan.nodes.warm,
            MaxGroupPreparedCapacity=plan.nodes.min + plan.nodes.warm,
            PoolState="Running" if pool.warm_pool.state == "running" else "Stopped",
            InstanceReusePolicy={"ReuseOnScaleIn": True},
        )
