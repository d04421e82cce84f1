"""The node identity: read the pool's weights prefix, write logs and the queue metric. Nothing
else. Scopes on the VM stay `cloud-platform`; these bindings are what limits it."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlparse

from constructs import Construct

from poolctl.stacks._providers import google

OBJECT_VIEWER = "roles/storage.objectViewer"
PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")


def split_gs(uri: str) -> tuple[str, str]:
    """gs://bucket/a/b/ -> ("bucket", "a/b/"); the prefix keeps one trailing slash so that
    `llama` cannot match `llama-old/`."""
    u = urlparse(uri)
    prefix = u.path.lstrip("/")
    return u.netloc, (prefix.rstrip("/") + "/" if prefix else "")


def account_id(name: str) -> str:
    """A service-account id: 6-30 chars, [a-z][-a-z0-9]*[a-z0-9]."""
    cand = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if not cand[:1].isalpha():
        cand = f"p{cand}"
    if len(cand) > 30:
        cand = f"{cand[:23].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"
    cand = cand.rstrip("-")
    return cand if len(cand) >= 6 else f"{cand}-node"[:30]


def weights_condition(bucket: str, prefix: str) -> dict[str, str] | None:
    """IAM condition limiting objectViewer to the weights prefix: object reads by resource
    name, listings by the requested list prefix (`objectListPrefix`), the GCS counterpart of
    the AWS role's s3:prefix condition. None when the URI names the whole bucket."""
    if not prefix:
        return None
    return {
        "title": "poolctl-weights-prefix",
        "description": f"read gs://{bucket}/{prefix} only",
        "expression": (
            f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}") || '
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
            f'.startsWith("{prefix}")'
        ),
    }


class NodeServiceAccount(Construct):
    """Requires uniform bucket-level access on the weights bucket: IAM conditions are not
    accepted on buckets with fine-grained ACLs."""

    def __init__(self, scope: Construct, id: str, *, name: str, project: str,
                 weights_uri: str) -> None:
        super().__init__(scope, id)
        bucket, prefix = split_gs(weights_uri)
        self.sa = google("service_account").ServiceAccount(
            self, "sa", account_id=account_id(name), project=project,
            display_name=f"poolctl {name} nodes",
            description="Reads the pool's weights prefix, writes logs and the queue metric.",
        )
        member = f"serviceAccount:{self.sa.email}"
        cond = weights_condition(bucket, prefix)
        iam = google("storage_bucket_iam_member")
        iam.StorageBucketIamMember(
            self, "weights", bucket=bucket, role=OBJECT_VIEWER, member=member,
            condition=iam.StorageBucketIamMemberCondition(**cond) if cond else None,
        )
        for role in PROJECT_ROLES:
            google("project_iam_member").ProjectIamMember(
                self, role.rsplit(".", 1)[-1], project=project, role=role, member=member,
            )
