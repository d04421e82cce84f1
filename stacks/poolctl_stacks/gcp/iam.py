"""The node identity: read the pool's weights prefix (and its API-key secret, if any), write
logs and the queue metric. Nothing else. Scopes on the VM stay `cloud-platform`; these
bindings are what limits it."""

from __future__ import annotations

import hashlib
import re

from constructs import Construct

from poolctl.formats import ObjectPrefix
from poolctl_stacks._providers import google

OBJECT_VIEWER = "roles/storage.objectViewer"
OBJECT_CREATOR = "roles/storage.objectCreator"
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
_CEL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cel_string(text: str) -> str:
    """`text` as a CEL string literal. The config model already keeps quotes and backslashes
    out of bucket names and prefixes; escaping here keeps a condition's meaning fixed even
    if that ever changes."""
    body = "".join(_CEL_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch)
                   for ch in text)
    return f'"{body}"'


def account_id(name: str) -> str:
    """A service-account id: 6-30 chars, [a-z][-a-z0-9]*[a-z0-9]."""
    cand = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if not cand[:1].isalpha():
        cand = f"p{cand}"
    if len(cand) > 30:
        cand = f"{cand[:23].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"
    cand = cand.rstrip("-")
    return cand if len(cand) >= 6 else f"{cand}-node"[:30]


def weights_condition(weights: ObjectPrefix, title: str = "poolctl-weights-prefix",
                      verb: str = "read") -> dict[str, str] | None:
    """IAM condition limiting objectViewer to the weights prefix: object reads by resource
    name, listings by the requested list prefix (`objectListPrefix`), the GCS counterpart of
    the AWS role's s3:prefix condition. None when the URI names the whole bucket."""
    bucket, prefix = weights.bucket, weights.prefix
    if not prefix:
        return None
    objects = cel_string(f"projects/_/buckets/{bucket}/objects/{prefix}")
    return {
        "title": title,
        "description": f"{verb} {weights.uri} only",
        "expression": (
            f"resource.name.startsWith({objects}) || "
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
            f".startsWith({cel_string(prefix)})"
        ),
    }


class NodeServiceAccount(Construct):
    """Requires uniform bucket-level access on the weights bucket: IAM conditions are not
    accepted on buckets with fine-grained ACLs."""

    def __init__(self, scope: Construct, id: str, *, name: str, project: str,
                 weights: ObjectPrefix, api_key_secret: str | None = None,
                 compile_cache: ObjectPrefix | None = None) -> None:
        super().__init__(scope, id)
        self.sa = google("service_account").ServiceAccount(
            self, "sa", account_id=account_id(name), project=project,
            display_name=f"poolctl {name} nodes",
            description="Reads the pool's weights prefix, writes logs and the queue metric.",
        )
        member = f"serviceAccount:{self.sa.email}"
        cond = weights_condition(weights)
        iam = google("storage_bucket_iam_member")
        iam.StorageBucketIamMember(
            self, "weights", bucket=weights.bucket, role=OBJECT_VIEWER, member=member,
            condition=iam.StorageBucketIamMemberCondition(**cond) if cond else None,
        )
        if compile_cache is not None:  # the shared torch.compile cache: read and create there
            cc = weights_condition(compile_cache, "poolctl-compile-cache-prefix",
                                   "read and write")
            for key, role in (("compile-cache-read", OBJECT_VIEWER),
                              ("compile-cache-write", OBJECT_CREATOR)):
                iam.StorageBucketIamMember(
                    self, key, bucket=compile_cache.bucket, role=role, member=member,
                    condition=iam.StorageBucketIamMemberCondition(**cc) if cc else None,
                )
        if api_key_secret:  # projects/P/secrets/NAME: read access to that one secret
            _, secret_project, _, secret_name = api_key_secret.split("/")
            google("secret_manager_secret_iam_member").SecretManagerSecretIamMember(
                self, "api-key", project=secret_project, secret_id=secret_name,
                role=SECRET_ACCESSOR, member=member,
            )
        for role in PROJECT_ROLES:
            google("project_iam_member").ProjectIamMember(
                self, role.rsplit(".", 1)[-1], project=project, role=role, member=member,
            )
