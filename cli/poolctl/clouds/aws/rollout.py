"""Rollouts on AWS: the instance refresh, with checkpoints, cancel and rollback.

`rollout start` applies the new launch template version through Terraform with the group
pinned to its running version, then starts the instance refresh itself with a
DesiredConfiguration. The AWS provider would start one too, but only after it has already
moved the group to the new version (hashicorp/terraform-provider-aws#34189), so an automatic
or manual rollback would "return" to the new version. Started this way, AWS keeps the old
version as the group's until the refresh succeeds, and a rollback really goes back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poolctl.clouds.aws.api import AwsApi
from poolctl.clouds.base import (
    CancelsRollouts,
    Group,
    RolloutState,
    RolloutStatus,
    RollsBackRollouts,
)
from poolctl.config import Config, Pool
from poolctl.contract import aws as contract
from poolctl.errors import OperationFailed
from poolctl.sizing import PoolPlan

REFRESH_DONE = {"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"}
# An instance refresh's Status in poolctl's words (Baking: the refresh waits out its bake time
# after the last replacement, still in progress). A word AWS adds later reads as in progress
# until it is done.
REFRESH_STATUS = {
    "Pending": RolloutStatus.pending, "InProgress": RolloutStatus.in_progress,
    "Baking": RolloutStatus.in_progress, "Successful": RolloutStatus.successful,
    "Failed": RolloutStatus.failed, "Cancelling": RolloutStatus.cancelling,
    "Cancelled": RolloutStatus.cancelled, "RollbackInProgress": RolloutStatus.rolling_back,
    "RollbackSuccessful": RolloutStatus.rolled_back,
    "RollbackFailed": RolloutStatus.rollback_failed,
}


def refresh_state(r: dict[str, Any], group_version: str = "") -> RolloutState:
    """An instance refresh (DescribeInstanceRefreshes) as a RolloutState; `group_version`:
    the version the group runs (where the rollout came from)."""
    prefs = r.get("Preferences") or {}
    cps = list(prefs.get("CheckpointPercentages") or [100])
    live = ((r.get("ProgressDetails") or {}).get("LivePoolProgress") or {})
    live_pct = live.get("PercentageComplete", r.get("PercentageComplete", 0))
    status = r.get("Status", "")
    # Reached only on the way forward: a rollback or cancel keeps the old live progress.
    forward = not status.startswith(("Rollback", "Cancel"))
    reached = [c for c in cps if c <= live_pct] if forward else []
    rb = r.get("RollbackDetails") or {}
    desired = r.get("DesiredConfiguration") or {}
    spec = (desired.get("LaunchTemplate")
            or ((desired.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}
                ).get("LaunchTemplateSpecification") or {})
    to = str(spec.get("Version", group_version))
    return RolloutState(
        id=r["InstanceRefreshId"], cloud_status=status, done=status in REFRESH_DONE,
        status=REFRESH_STATUS.get(status, RolloutStatus.failed if status in REFRESH_DONE
                                  else RolloutStatus.in_progress),
        percentage_complete=float(r.get("PercentageComplete") or 0),
        checkpoints=cps, checkpoint_reached=max(reached) if reached else None,
        instances_to_update=r.get("InstancesToUpdate"),
        from_version=group_version if group_version != to else "", to_version=to,
        reason=r.get("StatusReason") or rb.get("RollbackReason") or "",
    )


class InstanceRefreshes(AwsApi, CancelsRollouts, RollsBackRollouts):
    """The rollout operations of `AwsOps`: an instance refresh to the launch template's
    newest version."""

    def _resolved_version(self, group: Group) -> tuple[str, int]:
        """(group's version as a number, the template's newest version)."""
        if not group.template:
            raise OperationFailed(
                f"group {group.name}: it launches from no launch template; poolctl rollouts "
                "need the stack's launch template (redeploy with `poolctl deploy`)")
        ec2 = self.client("ec2", group.region)
        with self.call("ec2:DescribeLaunchTemplates"):
            lt = ec2.describe_launch_templates(LaunchTemplateIds=[group.template]
                                               )["LaunchTemplates"][0]
        latest = int(lt["LatestVersionNumber"])
        v = group.version
        if v in ("", "$Latest"):
            v = str(latest)
        elif v == "$Default":
            v = str(lt["DefaultVersionNumber"])
        return v, latest

    def rollout_apply_env(self, group: Group, plan: PoolPlan, *, no_surge: bool
                          ) -> dict[str, str]:
        running, _ = self._resolved_version(group)
        return contract.rollout_env(
            plan, running_version=running, min_nodes=group.min_nodes,
            desired_nodes=group.desired_nodes, warm_min_nodes=group.warm_min_nodes,
            no_surge=no_surge)

    def rollout_begin(self, group: Group, cfg: Config, pool: Pool, plan: PoolPlan, *,
                      no_surge: bool, stack_dir: Path | None) -> RolloutState | None:
        running, latest = self._resolved_version(group)
        if str(latest) == running:
            # No new version: nothing to roll, unless a refresh is already on its way (the
            # provider starts one itself when the group was not pinned, e.g. on $Latest).
            state = self.rollout_state(group)
            return state if state is not None and not state.done else None
        # The stack's own preferences (the same function wrote them), sized for now.
        prefs = contract.refresh_api_preferences(pool, plan, desired=group.desired_nodes,
                                                 no_surge=no_surge)
        asg = self.client("autoscaling", group.region)
        desired: dict[str, Any] = (
            {"MixedInstancesPolicy": contract.mixed_instances_policy(pool, group.template,
                                                                     str(latest))}
            if len(contract.launch_types(pool)) > 1 else
            {"LaunchTemplate": {"LaunchTemplateId": group.template, "Version": str(latest)}})
        with self.call(f"autoscaling:StartInstanceRefresh {group.name}"):
            rid = asg.start_instance_refresh(
                AutoScalingGroupName=group.name, Strategy="Rolling",
                DesiredConfiguration=desired, Preferences=prefs,
            )["InstanceRefreshId"]
        return RolloutState(
            id=rid, status=RolloutStatus.pending, cloud_status="Pending", done=False,
            percentage_complete=0,
            checkpoints=list(prefs.get("CheckpointPercentages") or [100]),
            from_version=running, to_version=str(latest),
        )

    def rollout_state(self, group: Group) -> RolloutState | None:
        asg = self.client("autoscaling", group.region)
        # The newest refresh comes first; one record is all that is needed (no paging).
        with self.call(f"autoscaling:DescribeInstanceRefreshes {group.name}"):
            refreshes = asg.describe_instance_refreshes(
                AutoScalingGroupName=group.name, MaxRecords=1)["InstanceRefreshes"]
        return refresh_state(refreshes[0], group.version) if refreshes else None

    def _refresh_action(self, group: Group, api: str, method: str) -> RolloutState:
        """Cancel/Rollback InstanceRefresh, then the refresh as it now stands."""
        asg = self.client("autoscaling", group.region)
        with self.call(f"autoscaling:{api} {group.name}"):
            getattr(asg, method)(AutoScalingGroupName=group.name)
        state = self.rollout_state(group)
        assert state is not None  # the call above just acted on one
        return state

    def rollout_cancel(self, group: Group) -> RolloutState:
        return self._refresh_action(group, "CancelInstanceRefresh", "cancel_instance_refresh")

    def rollout_rollback(self, group: Group) -> RolloutState:
        return self._refresh_action(group, "RollbackInstanceRefresh",
                                    "rollback_instance_refresh")
