"""The node role: read the pool's weights prefix (and its API-key secret, if any), finish its
own lifecycle hook, publish the queue metric and logs, and, with `aws.ssm_access`, take SSM
Session Manager shells. Nothing else: no SSM parameters, no managed policies."""

from __future__ import annotations

import json

from constructs import Construct

from poolctl import naming
from poolctl.formats import ObjectPrefix
from poolctl_stacks._providers import aws

# Session Manager's agent channel (AWS Systems Manager user guide, "Create a custom IAM role
# for Session Manager"); the ssmmessages actions have no resource-level permissions.
SESSION_MANAGER_CHANNELS = [
    "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
]


class NodeRole(Construct):
    """`weights`: the config's parsed weights_uri; the policy is built from its bucket and
    prefix only (their shapes exclude IAM wildcards and policy variables)."""

    def __init__(self, scope: Construct, id: str, *, name: str, weights: ObjectPrefix,
                 asg_name: str, log_group_arn: str, tags: dict[str, str],
                 ssm_access: bool = False, api_key_secret: str | None = None,
                 compile_cache: ObjectPrefix | None = None,
                 stream_weights: bool = False) -> None:
        super().__init__(scope, id)
        bucket, prefix = weights.bucket, weights.prefix
        ident = aws("data_aws_caller_identity").DataAwsCallerIdentity(self, "me")
        part = aws("data_aws_partition").DataAwsPartition(self, "partition")
        region = aws("data_aws_region").DataAwsRegion(self, "region")

        self.role = aws("iam_role").IamRole(
            self, "role", name=name, tags=tags,
            assume_role_policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }],
            }),
        )
        # region.name is deprecated in aws 6.x but still set; `id` holds the same value in both.
        asg_arn = (f"arn:{part.partition}:autoscaling:{region.id}:"
                   f"{ident.account_id}:autoScalingGroup:*:autoScalingGroupName/{asg_name}")
        read_weights = [
            {
                "Sid": "ReadWeights",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:{part.partition}:s3:::{bucket}/{prefix}*"],
            },
            {
                "Sid": "ListWeights",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:{part.partition}:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
        ]
        statements = [
            *read_weights,
            {
                "Sid": "OwnLifecycleHook",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:CompleteLifecycleAction",
                    "autoscaling:RecordLifecycleActionHeartbeat",
                ],
                "Resource": [asg_arn],
            },
            {
                # PutMetricData has no resource-level permissions; the namespace condition
                # is the narrowest scope AWS offers.
                "Sid": "QueueMetric",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricData"],
                "Resource": ["*"],
                "Condition": {"StringEquals": {"cloudwatch:namespace": naming.METRIC_NAMESPACE}},
            },
            {
                "Sid": "Logs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": [f"{log_group_arn}:*"],
            },
        ]
        if compile_cache is not None:
            # The shared torch.compile cache (compile_cache_uri): the one prefix a node writes;
            # GetObject answers AccessDenied rather than NoSuchKey without ListBucket, which
            # the fetch reads as a miss either way.
            statements.append({
                "Sid": "CompileCache",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": [f"arn:{part.partition}:s3:::{compile_cache.bucket}/"
                             f"{compile_cache.prefix}*"],
            })
        if stream_weights:
            # aws.weights_load: stream: the serving container's own credentials, an hour of
            # this role, which may read the weights and nothing else (the node's role stays
            # out of the container: it has no route to the metadata endpoint).
            self.weights_role = aws("iam_role").IamRole(
                self, "weights_role", name=f"{name}{naming.WEIGHTS_ROLE_SUFFIX}", tags=tags,
                max_session_duration=3600,
                assume_role_policy=json.dumps({
                    "Version": "2012-10-17",
                    "Statement": [{
                        "Effect": "Allow",
                        "Principal": {"AWS": self.role.arn},
                        "Action": "sts:AssumeRole",
                    }],
                }),
            )
            aws("iam_role_policy").IamRolePolicy(
                self, "weights_policy", name=f"{name}-weights", role=self.weights_role.id,
                policy=json.dumps({"Version": "2012-10-17", "Statement": read_weights}),
            )
            statements.append({
                "Sid": "StreamWeights",
                "Effect": "Allow",
                "Action": ["sts:AssumeRole"],
                "Resource": [self.weights_role.arn],
            })
        if api_key_secret:
            statements.append({
                "Sid": "ApiKeySecret",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue"],
                "Resource": [api_key_secret],
            })
        if ssm_access:
            statements += [
                {
                    "Sid": "SessionManagerChannels",
                    "Effect": "Allow",
                    "Action": SESSION_MANAGER_CHANNELS,
                    "Resource": ["*"],
                },
                {
                    "Sid": "SessionManagerRegistration",
                    "Effect": "Allow",
                    "Action": ["ssm:UpdateInstanceInformation"],
                    "Resource": [f"arn:{part.partition}:ec2:{region.id}:{ident.account_id}:"
                                 "instance/*"],
                },
            ]
        aws("iam_role_policy").IamRolePolicy(
            self, "policy", name=f"{name}-node", role=self.role.id,
            policy=json.dumps({"Version": "2012-10-17", "Statement": statements}),
        )
        self.profile = aws("iam_instance_profile").IamInstanceProfile(
            self, "profile", name=name, role=self.role.name, tags=tags
        )


class LogsKey(Construct):
    """A customer-managed key for the pool's log groups, rotated yearly. The key policy
    keeps the account in control and lets CloudWatch Logs use it only for this account's
    log groups."""

    def __init__(self, scope: Construct, id: str, *, name: str, region: str,
                 tags: dict[str, str]) -> None:
        super().__init__(scope, id)
        ident = aws("data_aws_caller_identity").DataAwsCallerIdentity(self, "me")
        part = aws("data_aws_partition").DataAwsPartition(self, "partition")
        account = f"arn:{part.partition}:iam::{ident.account_id}:root"
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "AccountAdmin",
                    "Effect": "Allow",
                    "Principal": {"AWS": account},
                    "Action": "kms:*",
                    "Resource": "*",
                },
                {
                    "Sid": "CloudWatchLogs",
                    "Effect": "Allow",
                    "Principal": {"Service": f"logs.{region}.amazonaws.com"},
                    "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*",
                               "kms:GenerateDataKey*", "kms:Describe*"],
                    "Resource": "*",
                    "Condition": {"ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn":
                            f"arn:{part.partition}:logs:{region}:{ident.account_id}:*"
                    }},
                },
            ],
        }
        self.key = aws("kms_key").KmsKey(
            self, "key", description=f"poolctl {name}: logs", enable_key_rotation=True,
            deletion_window_in_days=7, policy=json.dumps(policy), tags=tags,
        )
        aws("kms_alias").KmsAlias(self, "alias", name=f"alias/poolctl/{name}",
                                  target_key_id=self.key.key_id)
