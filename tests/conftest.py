"""Shared fixtures.

The sandbox fixtures start ONE real sandbox server (moto + poolctl's extensions, over HTTP on
a free loopback port) for the whole session, with a temporary POOLCTL_HOME so that
`poolctl ... --sandbox` in any test finds it:

    def test_x(sandbox, sandbox_client):        # sandbox: the endpoint URL
        asg = sandbox_client("autoscaling")      # region us-east-1, test credentials

Tests share the server: use unique names, or ask for `sandbox_reset` to start from an empty
emulator (moto's reset plus the sandbox's quota values back to their start-up values).

Parallel runs (`pytest -n N --dist loadgroup`, what scripts/test does): every worker is its
own pytest session, so it has its own sandbox server (on a free port), its own POOLCTL_HOME
and its own deployed pool. The tests of one module run on one worker, in file order (they
may build on each other and share a module-scoped deploy or synthesis); a worker process
loads the jsii provider assemblies at most once, whatever synth modules it runs.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from poolctl.endpoints import NO_METADATA_ENV

# -------------------------------------------------------------------------------------
# No test can leave the machine. Set on import, before any SDK is imported (google-auth reads
# NO_GCE_CHECK once, at import) and inherited by every poolctl, Terraform and sandbox
# process a test starts: no SDK probes a metadata address, and a command run without
# --sandbox finds fake credentials and a loopback endpoint (port 9: refused at once), never a
# developer's profile or keys. tests/unit/test_offline_env.py checks it.
LOOPBACK = "http://127.0.0.1:9"
SUITE_ENV = {
    **NO_METADATA_ENV,
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_ENDPOINT_URL": LOOPBACK,  # boto3 and the AWS CLI; the sandbox's own wins
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "POOLCTL_GCE_ENDPOINT": LOOPBACK,  # plain http: called without credentials
    "CLOUDSDK_CONFIG": "/nonexistent/poolctl-tests/gcloud",  # no gcloud login found
    # An internal error a test provokes shows its traceback (tests/inproc.py fails on it).
    "POOLCTL_DEBUG": "1",
}
# Whatever would choose other credentials or endpoints than the above.
SUITE_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
               "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
               "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CREDENTIAL_EXPIRATION",
               "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN",
               "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
os.environ.update(SUITE_ENV)
for _name in SUITE_UNSET:
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def sandbox_home(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("poolctl-home")


@pytest.fixture(scope="session", autouse=True)
def _own_home_and_port(sandbox_home) -> Iterator[None]:
    """Every session (each xdist worker is one) gets its own POOLCTL_HOME, and a sandbox that
    a test starts without --port takes a free port (0) instead of the shared default 4600:
    parallel workers and other users of this machine never meet."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOLCTL_HOME", str(sandbox_home))
        mp.setenv("POOLCTL_SANDBOX_PORT", "0")
        yield


def _interrupts_reach_children() -> None:
    """Tests send Ctrl-C (SIGINT) to the poolctl processes they start. A shell without job
    control starts a background command (`scripts/test &`) with SIGINT ignored, and an
    ignored signal stays ignored in every child: Python then installs no KeyboardInterrupt
    handler and those tests wait forever. Give the suite (each xdist worker runs this too)
    the handler Python would have installed, so children start with the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """A parallel run must group by module (`--dist load` would split a module's tests, which
    build on each other, across workers); and xdist must keep the order that
    pytest_collection_modifyitems sets rather than reorder groups by size."""
    _interrupts_reach_children()
    if getattr(config.option, "numprocesses", None) and config.option.dist != "loadgroup":
        raise pytest.UsageError(
            f"--dist {config.option.dist}: this suite runs in parallel only with "
            "`--dist loadgroup` (scripts/test passes it): a module's tests build on each other")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _group_name(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    assert mark is not None, item.nodeid  # callers ask only of items that have one
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (`--dist loadgroup`): one group per module (all of tests/synth is one), so
    its tests run in file order on one worker (an explicit xdist_group mark wins), and the
    heaviest groups come first:
    xdist hands groups out in collection order, so the longest start at once and the short
    ones fill the gaps."""
    if not hasattr(config, "workerinput"):
        return  # a serial run keeps pytest's own order
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::", 1)[0]  # tests/unit/test_x.py -> unit/test_x
            # The synth tests share one worker: each worker that synthesizes in process
            # loads the provider assemblies into its jsii kernel once (~20 s of CPU).
            group = ("synth" if item.path.parent.name == "synth"
                     else module.removeprefix("tests/")[:-3])
            item.add_marker(pytest.mark.xdist_group(group))
    counts: dict[str, int] = {}
    for item in items:
        counts[_group_name(item)] = counts.get(_group_name(item), 0) + 1
    workers = int(config.workerinput.get("workercount", 4))
    rank = {g: i for i, g in enumerate(queue_order(counts, workers))}
    items.sort(key=lambda item: rank[_group_name(item)])  # stable: file order within a group


# Wall seconds of the long groups in a loaded run on 2 cores and 4 workers (stop 18, a fresh
# clone, `POOLCTL_TEST_CPU_LOG`); a group not listed counts SHORT_TEST_S per test. The first
# group on a worker to ask for `deployed_pool` deploys it (~95 s): the groups that use it are
# listed with that deploy (launch_day ran in 28 s after another group had deployed it).
GROUP_SECONDS = {
    "ops/test_image_build": 240, "e2e/test_deploy_sandbox": 225,
    "ops/test_runtime_aws": 224, "e2e/interrupts": 195, "ops/test_launch_day": 125,
    "ops/test_sandbox": 116, "synth": 106, "ops/test_nodes_check": 71,
    "unit/test_simulate": 29, "ops/test_runtime_gcp": 29, "unit/test_hostile_configs": 24,
    "unit/test_boot_runtime": 14, "ops/test_everyday": 9, "unit/test_images": 8,
}
SHORT_TEST_S = 0.07  # 549 short tests took 38 s in all


def _finish_time(order: list[str], counts: dict[str, int], workers: int) -> float:
    """When the last worker ends if xdist hands out the groups in `order`: each worker gets
    one group, then another whenever it has two tests or fewer left (xdist's loadscope rule:
    a worker runs a test only once it knows the next one)."""
    queue = list(order)
    pending: list[list[float]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def give(w: int) -> None:
        if queue:
            g = queue.pop(0)
            n = counts[g]
            pending[w] += [GROUP_SECONDS.get(g, SHORT_TEST_S * n) / n] * n

    for w in range(workers):
        give(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            give(w)
    while busy := [w for w in range(workers) if pending[w]]:
        w = min(busy, key=lambda x: clock[x])
        clock[w] += pending[w].pop(0)
        if len(pending[w]) <= 2:
            give(w)
    return max(clock)


def queue_order(counts: dict[str, int], workers: int) -> list[str]:
    """The order xdist should hand the groups out in (with --no-loadscope-reorder, which
    pytest_configure sets): the longest first, then pairwise swaps while the simulated finish
    (`_finish_time`) gets earlier. Longest-first alone is not enough: a long group of one
    test takes a second group at once, so two long ones can end up on one worker."""
    order = sorted(counts, key=lambda g: -GROUP_SECONDS.get(g, SHORT_TEST_S * counts[g]))
    best = _finish_time(order, counts, workers)
    head = min(len(order), 12)  # the long ones; the short ones fill the gaps in any order
    improved = True
    while improved:
        improved = False
        for i in range(head):
            for j in range(i + 1, head):
                order[i], order[j] = order[j], order[i]
                t = _finish_time(order, counts, workers)
                if t < best - 1e-9:
                    best, improved = t, True
                else:
                    order[i], order[j] = order[j], order[i]
    return order


# Where the suite's CPU goes (scripts/bench/suite_cpu.py): with POOLCTL_TEST_CPU_LOG=FILE
# each worker appends one JSON line per group of tests: wall seconds, its own CPU, the CPU of
# the processes it ran and waited for (poolctl, Terraform, node ...), and its sandbox server's.
_cpu: dict[str, dict[str, float]] = {}


def _cpu_now() -> tuple[float, float, float]:
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = 0.0
    if os.environ.get("POOLCTL_HOME"):  # the session sandbox's home while it runs
        try:
            state = Path(os.environ["POOLCTL_HOME"]) / "sandbox" / "state.json"
            pid = json.loads(state.read_text())["pid"]
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not os.environ.get("POOLCTL_TEST_CPU_LOG"):
        yield
        return
    import time

    t0, before = time.monotonic(), _cpu_now()
    yield
    after = _cpu_now()
    mark = item.get_closest_marker("xdist_group")
    group = _group_name(item) if mark else item.nodeid.split("::", 1)[0]
    acc = _cpu.setdefault(group, {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0, "children_cpu_s": 0.0,
                                  "sandbox_cpu_s": 0.0})
    acc["tests"] += 1
    acc["wall_s"] += time.monotonic() - t0
    for key, a, b in zip(("cpu_s", "children_cpu_s", "sandbox_cpu_s"), before, after,
                         strict=True):
        acc[key] += max(0.0, b - a)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("POOLCTL_TEST_CPU_LOG")
    if not path or not _cpu:
        return
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    with open(path, "a") as f:
        for group, acc in _cpu.items():
            f.write(json.dumps({"worker": worker, "group": group,
                                **{k: round(v, 2) for k, v in acc.items()}}) + "\n")


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """In the controller, as each xdist worker reports its tests: refuse to run unless xdist
    marked every one with its group (`nodeid@group`, see pytest_collection_modifyitems).
    Unmarked tests are scheduled one by one, and a module's chained tests (deploy, inspect,
    roll out ...) would run on different workers against different sandboxes: pytest 9.2
    with xdist 3.8 does that (pyproject.toml)."""
    if node.config.option.dist != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("::")[2]]
    if lost:
        pytest.exit(
            f"pytest-xdist did not put {len(lost)} tests in their groups (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together (pytest-dev/pytest-xdist#1386);"
            " install the versions pyproject.toml allows (scripts/setup does)", returncode=2)


@pytest.fixture(scope="session")
def sandbox(sandbox_home) -> Iterator[str]:
    """Endpoint URL of a sandbox server running for the whole test session."""
    why = "moto's server is not installed (pip install -e .[sandbox])"
    pytest.importorskip("moto.server", reason=why)
    pytest.importorskip("flask", reason=why)
    from poolctl.sandbox import manager

    previous = os.environ.get("POOLCTL_HOME")
    os.environ["POOLCTL_HOME"] = str(sandbox_home)
    # Manual boot: tests complete the launch hooks at the moments they choose (boot-nodes).
    info = manager.start(port=0, home=sandbox_home, parent_pid=os.getpid(), boot_speedup=0)
    try:
        yield str(info.endpoint)
    finally:
        manager.stop(home=sandbox_home)
        if previous is None:
            os.environ.pop("POOLCTL_HOME", None)
        else:
            os.environ["POOLCTL_HOME"] = previous


@pytest.fixture
def sandbox_client(sandbox) -> Callable[..., Any]:
    """Factory of boto3 clients aimed at the session's sandbox."""
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    def make(service: str, region: str = "us-east-1") -> Any:
        return boto3.client(service, endpoint_url=sandbox, region_name=region, **TEST_CREDENTIALS)

    return make


def sandbox_admin(endpoint: str, method: str, path: str, body: dict | None = None) -> dict:
    """Call one of the sandbox's /_poolctl/ admin endpoints (or moto's /moto-api/)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw.decode(errors="replace")}


@pytest.fixture
def sandbox_reset(sandbox) -> str:
    """An empty sandbox for this test; returns the endpoint."""
    sandbox_admin(sandbox, "POST", "/moto-api/reset")
    return sandbox


# -------------------------------------------------------------------------------------
# A pool deployed to the session's sandbox (the example the contract describes)

REPO = Path(__file__).resolve().parents[1]
DEPLOYED_EXAMPLE = REPO / "examples" / "llama-70b-p5" / "poolctl.yaml"
DEPLOYED_REGION = "us-east-1"
# What the fixture handed out, so a test that needs it again finds it re-created when an
# earlier test wiped the emulator (moto's reset) or destroyed the stack.
_deployed: dict[str, Any] = {}
_deployed_at: list[Any] = []  # [endpoint, POOLCTL_HOME] once the fixture ran or a test adopted


@functools.cache
def provider_mirror() -> str | None:
    """POOLCTL_PROVIDER_MIRROR, else the mirror scripts/env.sh discovers on this machine."""
    named = os.environ.get("POOLCTL_PROVIDER_MIRROR")
    if named:
        return named if Path(named).is_dir() else None
    try:
        script = 'source scripts/env.sh >/dev/null 2>&1; echo "${POOLCTL_PROVIDER_MIRROR:-}"'
        found = subprocess.run(
            ["bash", "-c", script],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if found and Path(found).is_dir() else None


def terraform_binary() -> str | None:
    named = os.environ.get("POOLCTL_TERRAFORM")
    if named:
        return shutil.which(named)
    return shutil.which("terraform") or shutil.which("tofu")


def terraform_missing() -> str | None:
    """Why a Terraform deploy to the sandbox cannot run on this machine, or None."""
    if terraform_binary() is None:
        named = os.environ.get("POOLCTL_TERRAFORM")
        if named:
            return f"POOLCTL_TERRAFORM={named} is not an executable"
        return "no terraform or tofu binary on PATH, and POOLCTL_TERRAFORM is unset"
    if provider_mirror() is None:
        return ("no offline provider mirror: POOLCTL_PROVIDER_MIRROR is unset and "
                "scripts/env.sh found none")
    return None


def poolctl_env(home: Path | str, **extra: str) -> dict[str, str]:
    """Environment for `python -m poolctl` aimed at the session sandbox's POOLCTL_HOME."""
    env = {**os.environ, "POOLCTL_HOME": str(home), **extra}
    mirror = provider_mirror()
    if mirror:
        env["POOLCTL_PROVIDER_MIRROR"] = mirror
    return env


def run_poolctl(home: Path | str, *args: str, timeout: float = 900, child: bool = False,
                **extra: str) -> subprocess.CompletedProcess:
    """The real CLI, in this worker as a child would run it (tests/inproc.py: its imports and
    the jsii kernel load once per worker), or with `child` in a subprocess (signals, the
    console script itself); synthesis goes under POOLCTL_HOME, never into the repo."""
    env = poolctl_env(home, **extra)
    if not child:
        from tests import inproc

        return inproc.run(args, env=env, cwd=home, timeout=timeout)
    from tests.inproc import check_no_internal_error

    return check_no_internal_error(subprocess.run(
        [sys.executable, "-m", "poolctl", *args], capture_output=True, text=True,
        env=env, cwd=str(home), timeout=timeout,
    ))


def pool_cli(home: Path | str, pool_file: Path) -> Any:
    """`run(*args, ok=True)`: `poolctl ARGS -f pool_file --sandbox` (polling fast; in this
    worker, `run_poolctl`), asserting its exit code (True: 0, an int: that one, False: any).
    Commands that synthesize (deploy, rollout start/rollback) write beside the file."""
    out = pool_file.parent / "cdktf.out"

    def run(*args: str, ok: bool | int = True, timeout: float = 900) -> Any:
        argv = [*args, "-f", str(pool_file), "--sandbox"]
        if args[0] == "deploy" or (args[0] == "rollout" and args[1] in ("start", "rollback")):
            argv += ["--out", str(out)]
        res = run_poolctl(home, *argv, timeout=timeout, POOLCTL_POLL_S="0.05")
        expect = 0 if ok is True else ok
        if expect is not False:
            assert res.returncode == expect, (
                f"poolctl {' '.join(args)}: exit {res.returncode}, expected {expect}\n"
                f"{res.stderr[-3000:]}")
        return res

    return run


def _example_pool() -> tuple[Any, Any]:
    from poolctl.config import load_config

    cfg = load_config(DEPLOYED_EXAMPLE)
    return cfg, cfg.pools[0]


def _pool_group(endpoint: str, name: str) -> dict | None:
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=DEPLOYED_REGION,
                       **TEST_CREDENTIALS)
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return groups[0] if groups else None


def _forget_stale_state(endpoint: str, home: Path, stack: str, lb_name: str) -> None:
    """After moto's reset the Terraform state names resources that no longer exist: drop it
    (the same cleanup `poolctl sandbox stop` does), so the next deploy starts clean."""
    import boto3

    from poolctl.sandbox.manager import TEST_CREDENTIALS

    elbv2 = boto3.client("elbv2", endpoint_url=endpoint, region_name=DEPLOYED_REGION,
                         **TEST_CREDENTIALS)
    names = {lb["LoadBalancerName"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]}
    if lb_name in names:
        return  # only some resources went: Terraform's refresh re-creates what is missing
    shutil.rmtree(home / "sandbox" / "deploy" / stack, ignore_errors=True)
    (home / "sandbox" / "state" / f"{stack}.tfstate").unlink(missing_ok=True)


def _deploy_with_terraform(endpoint: str, home: Path) -> None:
    from poolctl import naming

    cfg, pool = _example_pool()
    _forget_stale_state(endpoint, home, naming.stack_name(cfg, pool, "aws"),
                        naming.short(naming.base(cfg, pool), 32))
    res = run_poolctl(home, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve",
                      "-f", str(DEPLOYED_EXAMPLE), "--out", str(home / "cdktf.out"))
    if res.returncode != 0:
        raise RuntimeError(f"poolctl deploy failed (exit {res.returncode}): "
                           f"{res.stderr[-3000:]}")


def _deploy_with_boto3(endpoint: str) -> None:
    """The resources the AWS stack creates that runtime commands look at, made directly:
    network, internal load balancer and target group, launch template (IMDSv2, no public
    IP, encrypted root), the group with its launch hook and warm pool, all tagged."""
    import boto3

    from poolctl import naming
    from poolctl.sandbox.manager import TEST_CREDENTIALS
    from poolctl.sizing import plan_pool

    cfg, pool = _example_pool()
    plan = plan_pool(pool, "aws")
    name = naming.base(cfg, pool)
    tags = naming.aws_tags(cfg, pool)
    kv = [{"Key": k, "Value": v} for k, v in tags.items()]

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=endpoint, region_name=DEPLOYED_REGION,
                            **TEST_CREDENTIALS)

    ec2, elbv2, asg = client("ec2"), client("elbv2"), client("autoscaling")
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
    ami = sorted(i["ImageId"] for i in ec2.describe_images(Owners=["amazon"])["Images"])[0]
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
        AutoScalingGroupName=name, MinSize=plan.nodes["min"],
        MaxSize=plan.nodes["max"], DesiredCapacity=plan.nodes["min"],
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
    if plan.nodes["warm"]:
        asg.put_warm_pool(
            AutoScalingGroupName=name, MinSize=plan.nodes["warm"],
            MaxGroupPreparedCapacity=plan.nodes["min"] + plan.nodes["warm"],
            PoolState="Running" if pool.warm_pool.state == "running" else "Stopped",
            InstanceReusePolicy={"ReuseOnScaleIn": True},
        )


def ensure_deployed_pool(endpoint: str, home: Path) -> dict[str, Any]:
    """Make sure the example pool exists in the sandbox; cheap when it does (one call).

    A new deployment also plays the nodes' boot scripts (completes the launch hook), as
    `poolctl sandbox boot-nodes` does: the group's node InService, the warm pool settled.
    """
    from poolctl import naming

    cfg, pool = _example_pool()
    name = naming.base(cfg, pool)
    out = _deployed or {"file": str(DEPLOYED_EXAMPLE), "asg": name, "region": DEPLOYED_REGION,
                        "via": None}
    if _pool_group(endpoint, name) is None:
        missing = terraform_missing()
        if missing is None:
            _deploy_with_terraform(endpoint, home)
            out["via"] = "terraform"
        else:
            _deploy_with_boto3(endpoint)
            out["via"] = "boto3"
        sandbox_admin(endpoint, "POST", "/_poolctl/lifecycle-actions",
                      {"AutoScalingGroupName": name, "LifecycleActionResult": "CONTINUE"})
        _snapshot_pool(endpoint, home)
    elif out["via"] is None:  # deployed before this fixture ran (e.g. by the e2e test)
        state = home / "sandbox" / "state" / f"{naming.stack_name(cfg, pool, 'aws')}.tfstate"
        out["via"] = "terraform" if state.exists() else "boto3"
    _deployed.update(out)
    return _deployed


@pytest.fixture(scope="session")
def deployed_pool(sandbox, sandbox_home) -> Iterator[dict[str, Any]]:
    """The example pool (examples/llama-70b-p5/poolctl.yaml) deployed to the session sandbox.

    With Terraform and a provider mirror: `poolctl deploy --cloud aws --sandbox`; else the
    same tagged resources made with boto3. Yields {"file", "asg", "region", "via"}; its
    nodes have booted (1 InService, 2 Warmed:Stopped). Tests may change the pool; a test
    that wipes the sandbox or destroys the stack does not break later users: the pool is
    re-created before the next test that asks for this fixture. A fresh deployment is
    kept as a sandbox snapshot (with its Terraform state), which the next group of tests
    on this worker starts from (pytest_runtest_setup), as from a pool a test deployed and
    handed over (`adopt_deployed_pool`).
    """
    if not _deployed_at:  # else a test deployed the pool and handed it over
        _deployed_at[:] = [sandbox, Path(sandbox_home)]
        # Groups that ran before on this worker may have left instances (quota in use).
        _fresh_sandbox(sandbox, Path(sandbox_home))
    yield ensure_deployed_pool(sandbox, Path(sandbox_home))


def adopt_deployed_pool(endpoint: str, home: Path, group: str) -> None:
    """A test of `group` that deployed the example pool on an emptied sandbox and booted its
    nodes hands it to the `deployed_pool` users on this worker, as if the fixture had
    deployed it: they start from its snapshot instead of deploying again (~95 s)."""
    _deployed_at[:] = [endpoint, home]
    _pool_user[:] = [group]
    ensure_deployed_pool(endpoint, home)  # finds it; records how it was made
    _snapshot_pool(endpoint, home)


POOL_SNAPSHOT = "deployed-pool"


def _kept_state(home: Path) -> Path:
    """Where the Terraform state of the snapshot's moment is kept (beside the home, so no
    test of the home's files sees it)."""
    return home.parent / f"{home.name}-{POOL_SNAPSHOT}-state"


def _snapshot_pool(endpoint: str, home: Path) -> None:
    """Keep the pool as just deployed: the sandbox's copy of itself, and the Terraform
    state that matches it."""
    sandbox_admin(endpoint, "POST", "/_poolctl/snapshots", {"name": POOL_SNAPSHOT})
    kept = _kept_state(home)
    shutil.rmtree(kept, ignore_errors=True)
    state = home / "sandbox" / "state"
    if state.is_dir():
        shutil.copytree(state, kept)
    else:
        kept.mkdir()


def _restore_pool(endpoint: str, home: Path) -> bool:
    """Put the sandbox and the Terraform states back as `_snapshot_pool` kept them, in a
    second or two instead of a deploy's minutes; False if there is no snapshot (a reset
    dropped it)."""
    try:
        sandbox_admin(endpoint, "POST", f"/_poolctl/snapshots/{POOL_SNAPSHOT}/restore")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return False
    state = home / "sandbox" / "state"
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(_kept_state(home), state)
    # Work directories of stacks deployed after the snapshot: their resources are gone.
    kept = {p.name.removesuffix(".tfstate") for p in state.glob("*.tfstate")}
    deploy = home / "sandbox" / "deploy"
    for workdir in deploy.iterdir() if deploy.is_dir() else ():
        if workdir.name not in kept:
            shutil.rmtree(workdir, ignore_errors=True)
    for records in ("warm", "rollouts"):
        shutil.rmtree(home / records, ignore_errors=True)
    return True


def _fresh_pool(endpoint: str, home: Path) -> None:
    """The pool as deployed, for the next group of tests: restored from the snapshot, else
    (none) an empty sandbox on which `ensure_deployed_pool` deploys it anew."""
    if not _restore_pool(endpoint, home):
        _fresh_sandbox(endpoint, home)


def _fresh_sandbox(endpoint: str, home: Path) -> None:
    """Empty the emulator and drop what poolctl keeps of the pool under POOLCTL_HOME (the
    sizes `warm` set survive a deploy, rollout records steer the next rollout): the next
    `ensure_deployed_pool` deploys the pool as the file describes it."""
    sandbox_admin(endpoint, "POST", "/moto-api/reset")
    for kept in ("warm", "rollouts"):
        shutil.rmtree(home / kept, ignore_errors=True)


_pool_user: list[str] = []  # the xdist group (module) whose tests used the pool last


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each group of tests gets the pool as deployed: a worker runs several groups in turn,
    and the tests of one group change the pool (sizes, versions, quota) as they go. The
    sandbox's snapshot of the fresh deployment is restored (a second); a deploy only where
    a test wiped the sandbox."""
    if "deployed_pool" not in getattr(item, "fixturenames", ()):
        return
    mark = item.get_closest_marker("xdist_group")
    group = _group_name(item) if mark else item.nodeid.split("::", 1)[0]
    if _deployed_at:
        if _pool_user and _pool_user[0] != group:
            _fresh_pool(*_deployed_at)
        ensure_deployed_pool(*_deployed_at)
    _pool_user[:] = [group]
