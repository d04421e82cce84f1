"""Fixes to moto (5.2.x) that the other extensions, and Terraform, rely on.

- Instances launched for a group carry the launch template version the group resolves
  (moto tags them with the template's default version while using another's AMI:
  launches.run_instances), and DescribeAutoScalingGroups / DescribeAutoScalingInstances
  report each instance's own LaunchTemplate version (moto reports the template's default
  version for every one).
- CreateLaunchTemplateVersion stores UserData as moto's CreateLaunchTemplate does (moto kept
  a plain string, and launching from that version failed an assertion: HTTP 500).
- UpdateAutoScalingGroup without a launch template or mixed instances policy keeps the
  group's mixed instances policy (moto dropped it on every update, e.g. a new MinSize).
- CreateAutoScalingGroup on an existing name is AlreadyExists (moto replaced the group), and
  DeleteAutoScalingGroup deletes the group's lifecycle hooks and scaling policies, as AWS
  does (moto kept them, so a new group of the same name inherited them).
- GetSecretValue on a secret scheduled for deletion is InvalidRequestException with AWS's
  message, "You can't perform this operation on the secret because it was marked for
  deletion." (moto's message repeated the CLI's own "An error occurred ..." prefix and a run
  of spaces, which a node's boot failure line would carry).
- AWS's managed policies (MOTO_IAM_LOAD_MANAGED_POLICIES, server.py) exist in the `aws`
  partition only, the one the sandbox serves. moto built all 1,595 of them for each of its six
  partitions' IAM backends, on every reset and at the first request after it (its access-key
  lookup visits every partition): ~0.7 s each time, plus as much again per snapshot taken or
  restored (snapshots.py copies every backend). In a suite module that resets between tests
  that was ~80 % of the sandbox's CPU (py-spy, ops/test_sandbox_capacity). Now the `aws`
  partition's are built once per account and copied at each reset.

The ones below make a second `terraform plan` after `poolctl deploy --sandbox` empty (the AWS
provider reads back every attribute it wrote; a missing one is a perpetual diff):
- DefaultInstanceWarmup: CreateAutoScalingGroup and UpdateAutoScalingGroup store it (-1
  clears it) and DescribeAutoScalingGroups returns it; moto dropped it.
- PutScalingPolicy stores Enabled (default true) and DescribePolicies returns it; moto
  dropped it. PredictiveScalingConfiguration is returned only when one was given (moto
  returned an empty one for every policy).
- CreateLaunchTemplate: the request's TagSpecifications tag the launch template itself; moto
  also copied them into version 1's LaunchTemplateData, where they would tag the resources
  the template launches (DescribeLaunchTemplateVersions showed a `launch-template` entry no
  caller wrote).
- DescribeSecurityGroupRules returns the Description of a rule that references a security
  group (moto returned it for CIDR rules only).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from poolctl.sandbox.extensions.common import LOCK, autoscaling_error, validation_error
from poolctl.sandbox.extensions.launches import launched_from

NAMES = (
    "moto-fixes.launch-template-version",
    "moto-fixes.default-instance-warmup",
    "moto-fixes.scaling-policy-enabled",
    "moto-fixes.launch-template-tag-specifications",
    "moto-fixes.security-group-rule-description",
    "moto-fixes.group-create-delete",
    "moto-fixes.update-keeps-mixed-instances-policy",
    "moto-fixes.secret-marked-for-deletion",
    "moto-fixes.iam-managed-policies-aws-partition",
)
MARKED_FOR_DELETION = ("You can't perform this operation on the secret because it was marked "
                       "for deletion.")


def _instance_warmup(raw: Any) -> int | None:
    """DefaultInstanceWarmup as stored: -1 (the documented way to clear it) means none."""
    if raw is None or str(raw).strip() == "":
        return None
    value = int(raw)
    if value < -1:
        raise validation_error("DefaultInstanceWarmup must be -1 or a number of seconds >= 0")
    return None if value == -1 else value


def _wrap_create_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    def create_auto_scaling_group(self: Any) -> Any:
        backend = self.autoscaling_backend
        name = self._get_param("AutoScalingGroupName")
        if name in backend.autoscaling_groups:
            raise autoscaling_error(
                "AlreadyExists",
                f"AutoScalingGroup by this name already exists - A group with the name {name} "
                "already exists",
            )
        warmup = _instance_warmup(self._get_param("DefaultInstanceWarmup"))
        out = orig(self)
        backend.autoscaling_groups[name].default_instance_warmup = warmup
        return out

    return create_auto_scaling_group


def _wrap_update_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    def update_auto_scaling_group(self: Any) -> Any:
        raw = self._get_param("DefaultInstanceWarmup")
        warmup = _instance_warmup(raw)
        out = orig(self)
        group = self.autoscaling_backend.autoscaling_groups.get(
            self._get_param("AutoScalingGroupName")
        )
        if group is not None and raw is not None:
            group.default_instance_warmup = warmup
        return out

    return update_auto_scaling_group


def _wrap_create_launch_template_version(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Parse UserData of a new version the way CreateLaunchTemplate does (base64 checked)."""

    def create_launch_template_version(self: Any) -> Any:
        from moto.ec2.utils import parse_user_data

        orig_get = self._get_param

        def get_param(name: str, *args: Any, **kwargs: Any) -> Any:
            value = orig_get(name, *args, **kwargs)
            if name == "LaunchTemplateData" and isinstance(value, dict) and (
                    "UserData" in value):
                value = {**value, "UserData": parse_user_data(value["UserData"])}
            return value

        self._get_param = get_param
        try:
            return orig(self)
        finally:
            del self._get_param

    return create_launch_template_version


def _wrap_put_scaling_policy(orig: Callable[..., Any]) -> Callable[..., Any]:
    def put_scaling_policy(self: Any) -> Any:
        out = orig(self)
        policy = self.autoscaling_backend.policies.get(self._get_param("PolicyName"))
        if policy is not None:
            policy.enabled = self._get_bool_param("Enabled", True)
            if not self._get_param("PredictiveScalingConfiguration"):
                policy.predictive_scaling_configuration = None
        return out

    return put_scaling_policy


def _wrap_create_launch_template(orig: Callable[..., Any]) -> Callable[..., Any]:
    def create_launch_template(self: Any) -> Any:
        # Read before moto's handler, which appends the template's own tags to this list.
        given = copy.deepcopy(
            (self._get_param("LaunchTemplateData") or {}).get("TagSpecifications")
        )
        out = orig(self)
        template = self.ec2_backend.get_launch_template_by_name(
            self._get_param("LaunchTemplateName")
        )
        data = template.versions[0].data
        if given:
            data["TagSpecifications"] = given
        else:
            data.pop("TagSpecifications", None)
        return out

    return create_launch_template


def _rule_description(self: Any) -> str | None:
    return self.ip_range.get("Description") or (self.source_group or {}).get("Description")


def _delete_group_children(backend: Any, group_name: str) -> None:
    for key, hook in list(backend.lifecycle_hooks.items()):
        if hook.auto_scaling_group_name == group_name:
            del backend.lifecycle_hooks[key]
    for key, policy in list(backend.policies.items()):
        if policy.auto_scaling_group_name == group_name:
            del backend.policies[key]


def _fresh_policy(policy: Any) -> Any:
    """A copy of an AWS managed policy as moto built it, with state of its own (attachment
    count, tags, versions): what a reset gives, without building it again."""
    fresh = copy.copy(policy)
    fresh.tags = dict(policy.tags)
    fresh.versions = [copy.copy(v) for v in policy.versions]
    return fresh


def install() -> None:
    from moto.autoscaling.models import AutoScalingBackend, InstanceState
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.ec2.models.security_groups import SecurityGroupRule
    from moto.ec2.responses.launch_templates import LaunchTemplates

    AutoScalingResponse.create_auto_scaling_group = _wrap_create_group(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.create_auto_scaling_group
    )
    AutoScalingResponse.update_auto_scaling_group = _wrap_update_group(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.update_auto_scaling_group
    )
    AutoScalingResponse.put_scaling_policy = _wrap_put_scaling_policy(  # type: ignore[method-assign]  # moto extension: wrapped
        AutoScalingResponse.put_scaling_policy
    )
    LaunchTemplates.create_launch_template = _wrap_create_launch_template(  # type: ignore[method-assign]  # moto extension: wrapped
        LaunchTemplates.create_launch_template
    )
    LaunchTemplates.create_launch_template_version = _wrap_create_launch_template_version(  # type: ignore[method-assign]  # moto extension: wrapped
        LaunchTemplates.create_launch_template_version)
    SecurityGroupRule.description = property(_rule_description)  # type: ignore[method-assign,assignment]  # moto extension: a property replaced

    orig_update = AutoScalingBackend.update_auto_scaling_group

    def update_auto_scaling_group(self: Any, name: str, *args: Any, **kw: Any) -> Any:
        # Only a request naming a launch template, configuration or policy changes it; the
        # group's policy is in place before the update launches anything.
        group = self.autoscaling_groups.get(name)
        if (group is not None and group.mixed_instances_policy
                and not kw.get("mixed_instances_policy") and not kw.get("launch_template")
                and not kw.get("launch_config_name")):
            policy = copy.deepcopy(group.mixed_instances_policy)
            # As stored, the spec names the template by id and name; a request gives one.
            spec = policy["LaunchTemplate"]["LaunchTemplateSpecification"]
            if spec.get("LaunchTemplateId"):
                spec.pop("LaunchTemplateName", None)
            kw["mixed_instances_policy"] = policy
        return orig_update(self, name, *args, **kw)

    AutoScalingBackend.update_auto_scaling_group = update_auto_scaling_group  # type: ignore[method-assign]  # moto extension: the policy kept

    orig_delete = AutoScalingBackend.delete_auto_scaling_group

    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        with LOCK:
            orig_delete(self, group_name)
            _delete_group_children(self, group_name)

    AutoScalingBackend.delete_auto_scaling_group = delete_auto_scaling_group  # type: ignore[method-assign]  # moto extension: children too

    orig_lt = InstanceState.launch_template

    def launch_template(self: Any) -> dict[str, Any] | None:
        source = launched_from(self.instance)
        if source is None or source[0] != "lt":
            stock: dict[str, Any] | None = orig_lt.fget(self)  # type: ignore[attr-defined]  # moto: launch_template is a property
            return stock
        _, template, number = source
        return {"LaunchTemplateId": template.id, "LaunchTemplateName": template.name,
                "Version": str(number)}

    InstanceState.launch_template = property(launch_template)  # type: ignore[method-assign,assignment]  # moto extension: a property replaced

    from moto.secretsmanager.exceptions import InvalidRequestException
    from moto.secretsmanager.models import SecretsManagerBackend

    orig_get_value = SecretsManagerBackend.get_secret_value

    def get_secret_value(self: Any, secret_id: str, *args: Any, **kw: Any) -> Any:
        secret = self.secrets[secret_id] if self._is_valid_identifier(secret_id) else None
        if secret is not None and secret.is_deleted():
            raise InvalidRequestException(MARKED_FOR_DELETION)
        return orig_get_value(self, secret_id, *args, **kw)

    SecretsManagerBackend.get_secret_value = get_secret_value  # type: ignore[method-assign]  # moto extension: AWS's message

    from moto.iam.models import IAMBackend

    orig_aws_policies = IAMBackend._init_aws_policies
    built: dict[str, list[Any]] = {}  # account -> its policies as moto first built them

    def init_aws_policies(self: Any) -> list[Any]:
        # IAM's backends are keyed by partition: region_name is "aws", "aws-cn", ...
        if self.region_name != "aws":
            return []
        if self.account_id not in built:
            built[self.account_id] = orig_aws_policies(self)
        return [_fresh_policy(p) for p in built[self.account_id]]

    IAMBackend._init_aws_policies = init_aws_policies  # type: ignore[method-assign]  # moto extension: one partition's policies


def reset() -> None:
    """Nothing kept outside moto's backends."""
