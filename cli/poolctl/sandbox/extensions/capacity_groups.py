"""Capacity Reservation groups in the sandbox: GroupResources, UngroupResources and
ListGroupResources of the Resource Groups API (moto has none of them), membership only: what
a Capacity Reservation group needs to be a launch target (`capacity.eligible` reads its
members)."""

from __future__ import annotations

from typing import Any

from poolctl.sandbox.extensions.common import locked, stored

NAMES = ("resource-groups.capacity-reservation-groups",)

_CR_TYPE = "AWS::EC2::CapacityReservation"


def _members(group: Any) -> list[str]:
    return stored(group, "_poolctl_members", list)


def group_members(arn: str) -> list[str]:
    """The Capacity Reservation ids in a resource group (GroupResources put them there)."""
    from moto.resourcegroups.models import resourcegroups_backends

    parts = arn.split(":")
    if len(parts) < 6:
        return []
    groups = resourcegroups_backends[parts[4]][parts[3]].groups
    if arn not in groups:
        return []
    return [m.rsplit("/", 1)[1] for m in _members(groups[arn]) if ":capacity-reservation/" in m]


def _rg_group(self: Any) -> Any:
    from moto.core.exceptions import JsonRESTError

    name = self._get_param("Group") or self._get_param("GroupName")
    groups = self.resourcegroups_backend.groups
    if not name or name not in groups:
        raise JsonRESTError("NotFoundException", f"Cannot find group {name}.")
    return groups[name]


def _rg_type(arn: str) -> str:
    return _CR_TYPE if ":capacity-reservation/" in arn else "AWS::Unknown"


def _rg_group_resources(self: Any) -> str:
    import json

    members = _members(_rg_group(self))
    arns = list(self._get_param("ResourceArns") or [])
    members.extend(a for a in arns if a not in members)
    return json.dumps({"Succeeded": arns, "Failed": [], "Pending": []})


def _rg_ungroup_resources(self: Any) -> str:
    import json

    members = _members(_rg_group(self))
    arns = list(self._get_param("ResourceArns") or [])
    members[:] = [m for m in members if m not in arns]
    return json.dumps({"Succeeded": arns, "Failed": [], "Pending": []})


def _rg_list_group_resources(self: Any) -> str:
    import json

    ids = [{"ResourceArn": a, "ResourceType": _rg_type(a)} for a in _members(_rg_group(self))]
    return json.dumps({"Resources": [{"Identifier": i} for i in ids],
                       "ResourceIdentifiers": ids, "QueryErrors": []})


def install() -> None:
    """GroupResources, UngroupResources, ListGroupResources (moto has none): membership only,
    what a Capacity Reservation group (a resource group with an
    AWS::EC2::CapacityReservationPool configuration) needs to be a launch target."""
    from moto.resourcegroups import urls
    from moto.resourcegroups.responses import ResourceGroupsResponse

    for path in ("group-resources", "ungroup-resources", "list-group-resources"):
        urls.url_paths[f"{{0}}/{path}$"] = ResourceGroupsResponse.dispatch
    for name, fn in {"group_resources": _rg_group_resources,
                     "ungroup_resources": _rg_ungroup_resources,
                     "list_group_resources": _rg_list_group_resources}.items():
        setattr(ResourceGroupsResponse, name, locked(fn))




def reset() -> None:
    """Members live on moto's resource groups, which moto's reset empties."""
