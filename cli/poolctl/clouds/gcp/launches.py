"""GCE launch failures for a pool: the VMs its regional MIG could not create, read from the
MIG's own record (regionInstanceGroupManagers.listErrors, newest first, each with the error
GCE gave, e.g. ZONE_RESOURCE_POOL_EXHAUSTED, and the VM it was for) and kept only while that
VM is still waiting to be created or started (its managed instance still CREATING, STARTING
...): one that was created since is no failure any more. So the VM still waiting is the
evidence, whenever its attempts began: unlike AWS's scaling activities, no time window
applies."""

from __future__ import annotations

from typing import Any

from poolctl.clouds.base import Group, LaunchFailure, ReportsLaunchFailures
from poolctl.clouds.gcp.api import link_name, link_zone
from poolctl.clouds.gcp.mig import MigReader, mig_ref

# The actions of a VM being created, or started out of the standby pool (a start needs
# capacity as a creation does), as the managed instance's currentAction.
CREATING = {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "STARTING", "RESUMING"}


class MigCapacity(MigReader, ReportsLaunchFailures):
    """The failed creations of `status` and `warm --wait` (part of `GcpOps`)."""

    def launch_failures(self, group: Group, instance_type: str, since_s: float = 3600
                        ) -> list[LaunchFailure]:
        project, region, name = mig_ref(group)
        waiting = {mi.instance: mi for mi in self.managed_instances(project, region, name)
                   if mi.current_action in CREATING}
        if not waiting:
            return []
        errors: Any = self.call(
            f"list errors of {name}",
            self.client("RegionInstanceGroupManagersClient").list_errors,
            project=project, region=region, instance_group_manager=name)
        out: list[LaunchFailure] = []
        seen: set[str] = set()
        for e in errors:  # newest first
            vm = e.instance_action_details.instance
            if vm not in waiting or vm in seen:
                continue  # created since, or an older attempt of one already listed
            seen.add(vm)
            out.append(LaunchFailure(zone=link_zone(vm), instance_type=instance_type,
                                     code=e.error.code or "LaunchFailed", at=e.timestamp,
                                     message=e.error.message, instance=link_name(vm)))
            if len(seen) == len(waiting):
                break  # every waiting VM named: no need to page through older attempts
        return out
