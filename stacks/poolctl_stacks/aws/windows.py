"""What a launch window of warm nodes (`warm --from --until` without `--running`) needs from
the stack: the pool's EventBridge Scheduler schedule group, and the role the scheduler
assumes to set this group's warm pool (`autoscaling:PutWarmPool` on it, nothing else) at a
window's edges. poolctl writes the schedules at runtime; Terraform manages none of them, so a
deploy keeps them, and deleting the group at destroy deletes them with it."""

from __future__ import annotations

import json

from constructs import Construct

from poolctl import naming
from poolctl_stacks._providers import aws


class WindowScheduler(Construct):
    def __init__(self, scope: Construct, id: str, *, name: str, asg_name: str,
                 tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        ident = aws("data_aws_caller_identity").DataAwsCallerIdentity(self, "me")
        part = aws("data_aws_partition").DataAwsPartition(self, "partition")
        region = aws("data_aws_region").DataAwsRegion(self, "region")
        self.group = aws("scheduler_schedule_group").SchedulerScheduleGroup(
            self, "group", name=name, tags=tags)
        # Only this account's schedules in this group may assume it (the confused-deputy
        # conditions of the EventBridge Scheduler user guide's execution role).
        self.role = aws("iam_role").IamRole(
            self, "role", name=name + naming.WINDOWS_ROLE_SUFFIX, tags=tags,
            assume_role_policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": {"Service": "scheduler.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                    "Condition": {
                        "StringEquals": {"aws:SourceAccount": ident.account_id},
                        "ArnLike": {"aws:SourceArn": (
                            f"arn:{part.partition}:scheduler:{region.id}:{ident.account_id}:"
                            f"schedule/{name}/*")},
                    },
                }],
            }),
        )
        asg_arn = (f"arn:{part.partition}:autoscaling:{region.id}:{ident.account_id}:"
                   f"autoScalingGroup:*:autoScalingGroupName/{asg_name}")
        aws("iam_role_policy").IamRolePolicy(
            self, "policy", name=name + naming.WINDOWS_ROLE_SUFFIX, role=self.role.id,
            policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Sid": "SetWarmPool", "Effect": "Allow", "Action": ["autoscaling:PutWarmPool"],
                "Resource": [asg_arn]}]}),
        )
