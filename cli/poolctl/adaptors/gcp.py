"""google-cloud-compute, google-cloud-quotas, google-auth and google-api-core (with
`requests`, which google-auth's transport uses), imported on first use (see
`poolctl.adaptors`). They are the optional `[gcp]` extra: a missing one is one line naming it.
"""

from __future__ import annotations

from poolctl.adaptors.common import LazyModule

_EXTRA = "pip install 'poolctl[gcp]'"
_MISSING = f"--cloud gcp: google-cloud-compute is not installed; {_EXTRA}"

compute_v1 = LazyModule("google.cloud.compute_v1", _MISSING)
cloudquotas_v1 = LazyModule(
    "google.cloud.cloudquotas_v1",
    f"quota request --cloud gcp: google-cloud-quotas is not installed; {_EXTRA}")
api_exceptions = LazyModule("google.api_core.exceptions", _MISSING)
api_retry = LazyModule("google.api_core.retry", _MISSING)
auth = LazyModule("google.auth", _MISSING)
auth_credentials = LazyModule("google.auth.credentials", _MISSING)
auth_exceptions = LazyModule("google.auth.exceptions", _MISSING)
auth_requests = LazyModule("google.auth.transport.requests", _MISSING)
service_account = LazyModule("google.oauth2.service_account", _MISSING)
field_mask_pb2 = LazyModule("google.protobuf.field_mask_pb2", _MISSING)
requests = LazyModule("requests", _MISSING)
