"""Compute Engine, OS Login, Monitoring and Logging plumbing for the GCP runtime: clients at
the endpoint given (`client_options`; the tests' fake), retries with backoff, waits on
long-running operations, and every failure turned into one line naming the call. No policy:
what poolctl does with a pool lives in `poolctl.clouds.gcp` (`GcpOps` builds on `GceApi`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from poolctl.clouds.base import (
    Group,
)
from poolctl.endpoints import GCE_ENDPOINT_ENV
from poolctl.errors import OperationFailed, UsageError

if TYPE_CHECKING:
    from google.api_core.retry import Retry

OSLOGIN_API = "https://oslogin.googleapis.com"
MONITORING_API = "https://monitoring.googleapis.com"
TOKENINFO = "https://oauth2.googleapis.com/tokeninfo"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_MIG_REF = re.compile(r"projects/([^/]+)/regions/([^/]+)/instanceGroupManagers/([^/?]+)")
WAIT_CALL_S = 150.0  # operations.wait answers within about 2 minutes, done or not


def _last(link: str) -> str:
    """Name at the end of a self link (`...?uniqueId=` from `self_link_unique` dropped)."""
    return link.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] if link else ""


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _zone(instance_link: str) -> str:
    m = re.search(r"/zones/([^/]+)/", instance_link or "")
    return m.group(1) if m else ""


def _email_of(creds: Any) -> str | None:
    """The account email credentials carry (service account, impersonated), if any."""
    for attr in ("service_account_email", "signer_email", "account"):
        email = getattr(creds, attr, None)
        if isinstance(email, str) and "@" in email:
            return email
    return None


def _error_message(r: Any) -> str:
    """The message of a Google REST error answer (`{"error": {"message": ...}}`)."""
    message: str
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text[:200]
    return message


def _created(t: Any) -> datetime:
    try:
        return datetime.fromisoformat(t.creation_timestamp)
    except ValueError:
        return datetime.min



class GceApi:
    """The calls `GcpOps` makes, each with its retries and its one-line failure."""

    def __init__(self, *, client_options: dict[str, Any] | Any | None = None,
                 credentials: Any = None,
                 retry_initial_s: float = 1.0, retry_deadline_s: float = 300.0,
                 call_timeout_s: float = 60.0, operation_timeout_s: float = 900.0) -> None:
        endpoint = ""
        if isinstance(client_options, dict):
            endpoint = client_options.get("api_endpoint") or ""
        elif client_options is not None:
            endpoint = getattr(client_options, "api_endpoint", "") or ""
        if credentials is None and endpoint.startswith("http://"):
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth: __init__ unannotated
        self._client_options = client_options
        self._credentials = credentials
        self._retry_initial_s = retry_initial_s
        self._retry_deadline_s = retry_deadline_s
        self._timeout = call_timeout_s
        self._operation_timeout_s = operation_timeout_s
        self._clients: dict[str, Any] = {}
        self._rest_session: tuple[Any, str] | None = None
        self._endpoint = endpoint.rstrip("/")
        self._retry_obj: Retry | None = None

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _compute() -> ModuleType:
        try:
            from google.cloud import compute_v1
        except ImportError:
            raise UsageError("--cloud gcp: google-cloud-compute is not installed; "
                             "pip install 'poolctl[gcp]'") from None
        return compute_v1

    def _client(self, name: str) -> Any:
        if name not in self._clients:
            self._clients[name] = self._build(name)
        return self._clients[name]

    def _build(self, name: str) -> Any:
        from google.auth import exceptions as auth_exc

        try:
            if name == "CloudQuotasClient":
                try:
                    from google.cloud import cloudquotas_v1
                except ImportError:
                    raise UsageError("quota request --cloud gcp: google-cloud-quotas is not "
                                     "installed; pip install 'poolctl[gcp]'") from None
                cls = cloudquotas_v1.CloudQuotasClient
            else:
                cls = getattr(self._compute(), name)
            return cls(credentials=self._credentials, client_options=self._client_options,
                       transport="rest")
        except auth_exc.DefaultCredentialsError:
            raise UsageError(
                "GCP credentials: none found; run `gcloud auth application-default login` "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
            ) from None

    def _retry(self) -> Retry:
        if self._retry_obj is None:
            import requests
            from google.api_core import exceptions as gexc
            from google.api_core import retry as retries

            # 429, 5xx and dropped connections are transient; mutations carry a request id,
            # so a retried patch is not applied twice.
            self._retry_obj = retries.Retry(
                predicate=retries.if_exception_type(
                    gexc.TooManyRequests, gexc.ResourceExhausted, gexc.InternalServerError,
                    gexc.BadGateway, gexc.ServiceUnavailable, gexc.GatewayTimeout,
                    requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                ),
                initial=self._retry_initial_s, maximum=30.0 * self._retry_initial_s,
                multiplier=2.0, timeout=self._retry_deadline_s,
            )
        return self._retry_obj

    def _call(self, what: str, fn: Callable[..., Any], *, not_found_ok: bool = False,
              timeout: float | None = None, **kw: Any) -> Any:
        """One API call (lists: the whole pager) with retries; failures become one line.
        NotFound is raised as is when the caller has its own words for it."""
        import requests
        from google.api_core import exceptions as gexc

        try:
            out = fn(**kw, retry=self._retry(), timeout=timeout or self._timeout)
            if hasattr(out, "pages"):  # a pager: fetch every page inside the error handling
                out = list(out)
            return out
        except gexc.RetryError as e:
            cause = e.cause.message if isinstance(e.cause, gexc.GoogleAPICallError) else (
                e.cause or e)
            raise OperationFailed(f"GCP {what}: still failing after retries "
                                  f"({_one_line(cause)})") from None
        except gexc.NotFound as e:
            if not_found_ok:
                raise
            raise OperationFailed(f"GCP {what}: 404 {_one_line(e.message)}") from None
        except gexc.GoogleAPICallError as e:
            raise OperationFailed(f"GCP {what}: {e.code} {_one_line(e.message)}") from None
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP {what}: {_one_line(e)}") from None

    def _lookup(self, what: str, fn: Callable[..., Any], **kw: Any) -> Any:
        """`_call` for callers that turn NotFound into words of their own."""
        return self._call(what, fn, not_found_ok=True, **kw)

    def _wait(self, op: Any, project: str, region: str | None, what: str) -> None:
        """Wait for a region operation (a global one with `region` None) through the
        injected operations client."""
        compute_v1 = self._compute()
        where: dict[str, Any]
        if region is None:
            ops, where, scope = self._client("GlobalOperationsClient"), {}, "--global"
        else:
            ops, where = self._client("RegionOperationsClient"), {"region": region}
            scope = f"--region {region}"
        done = compute_v1.Operation.Status.DONE
        deadline = time.monotonic() + self._operation_timeout_s
        while op.status != done:
            if time.monotonic() > deadline:
                raise OperationFailed(
                    f"GCP {what}: operation {op.name} not done after "
                    f"{self._operation_timeout_s:.0f} s; follow it with `gcloud compute "
                    f"operations describe {op.name} {scope}`")
            # operations.wait returns when the operation is DONE or after ~2 minutes.
            op = self._call(what, ops.wait, timeout=WAIT_CALL_S, project=project,
                            operation=op.name, **where)
        if op.error.errors:
            detail = "; ".join(f"{e.code}: {_one_line(e.message)}" for e in op.error.errors)
            raise OperationFailed(f"GCP {what}: {detail}")

    @staticmethod
    def _mig_ref(group: Group) -> tuple[str, str, str]:
        m = _MIG_REF.search(group.raw_id or "")
        if not m:
            raise OperationFailed(f"GCP group {group.name}: {group.raw_id!r} is not a regional "
                                  "MIG link; find the group with find_group first")
        return m.group(1), m.group(2), m.group(3)

    def _get_mig(self, project: str, region: str, name: str) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return self._lookup(f"get MIG {name}",
                                self._client("RegionInstanceGroupManagersClient").get,
                                project=project, region=region, instance_group_manager=name)
        except gexc.NotFound:
            raise OperationFailed(f"GCP MIG {name}: not found in {project}/{region}; was the "
                                  "pool destroyed? run `poolctl deploy --cloud gcp`") from None

    # ------------------------------------------------------------------ nodes check

    def running_instances(self, project: str, filter: str) -> list[tuple[str, Any]]:
        """instances.aggregatedList under `filter`: (zone key, InstancesScopedList) of every
        page, through the endpoint override like every other call."""
        compute_v1 = self._compute()
        scoped: list[tuple[str, Any]] = self._call(
            f"list instances of {project}", self._client("InstancesClient").aggregated_list,
            request=compute_v1.AggregatedListInstancesRequest(project=project, filter=filter))
        return scoped

    def _rest(self) -> tuple[Any, str]:
        """(AuthorizedSession, base URL) for OS Login, which has no client library here:
        the endpoint override (anonymous, as above) or Google's."""
        if self._rest_session is None:
            from google.auth import exceptions as auth_exc
            from google.auth.transport.requests import AuthorizedSession

            creds, base = self._credentials, self._endpoint or OSLOGIN_API
            if creds is None:
                import google.auth

                try:
                    creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
                except auth_exc.DefaultCredentialsError:
                    raise UsageError(
                        "GCP credentials: none found; run `gcloud auth application-default "
                        "login` or set GOOGLE_APPLICATION_CREDENTIALS") from None
            self._rest_session = (AuthorizedSession(creds), base)  # type: ignore[no-untyped-call]  # google-auth: __init__ unannotated
        return self._rest_session

    def caller_account(self) -> str:
        """The email of the Google account poolctl acts as: OS Login keys are imported for
        it. A service account names itself; user credentials are asked of Google
        (tokeninfo). Against a plain-http endpoint (a local fake) it can only come from a key
        file (GOOGLE_APPLICATION_CREDENTIALS): no token may leave the machine."""
        import requests
        from google.auth import exceptions as auth_exc
        from google.auth.transport.requests import Request

        fix = ("use a service account key (GOOGLE_APPLICATION_CREDENTIALS) or `gcloud auth "
               "application-default login` (its token carries the email scope)")
        session, base = self._rest()
        email: str | None
        try:
            if base.startswith("http://"):
                path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
                if not path:
                    raise UsageError(f"--access iap: no Google account to import the key for; "
                                     "set GOOGLE_APPLICATION_CREDENTIALS "
                                     f"({GCE_ENDPOINT_ENV} is "
                                     "plain http: no token is sent there)")
                from google.oauth2 import service_account

                try:
                    email = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]  # google-auth: unannotated
                        path).service_account_email
                except (OSError, ValueError, KeyError) as e:
                    raise UsageError(f"GOOGLE_APPLICATION_CREDENTIALS={path}: not a service "
                                     f"account key file ({_one_line(e)})") from None
            else:
                creds = session.credentials
                email = _email_of(creds)
                if email is None:
                    # Compute Engine credentials learn their email with their first token;
                    # user credentials never carry it.
                    creds.refresh(Request())
                    email = _email_of(creds)
                if email is None:
                    r = session.post(TOKENINFO, data={"access_token": creds.token},
                                     timeout=self._timeout)
                    email = r.json().get("email") if r.ok else None
        except (requests.exceptions.RequestException, ValueError) as e:
            raise UsageError(f"--access iap: cannot ask Google for the account "
                             f"({_one_line(e)}); {fix}") from None
        except auth_exc.GoogleAuthError as e:
            raise UsageError(f"--access iap: cannot read the Google account ({_one_line(e)}); "
                             f"{fix}") from None
        if not email:
            raise UsageError(f"--access iap: cannot tell which Google account poolctl acts "
                             f"as; {fix}")
        return email

    def _oslogin(self, method: str, path: str, what: str, **kw: Any) -> dict[str, Any]:
        """One OS Login call; an error becomes one line (403: the role that is missing)."""
        import requests

        session, base = self._rest()
        try:
            r = session.request(method, f"{base}/v1/{path}", timeout=self._timeout, **kw)
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP OS Login {what}: {_one_line(e)}") from None
        if r.ok:
            answer: dict[str, Any] = r.json() if r.content.strip() else {}
            return answer
        hint = ("; the caller needs roles/compute.osAdminLogin (or osLogin) on the project"
                if r.status_code == 403 else "")
        raise OperationFailed(f"GCP OS Login {what}: {r.status_code} "
                              f"{_one_line(_error_message(r))}{hint}")

    def import_ssh_key(self, account: str, public_key: str, project: str,
                       ttl_s: float) -> tuple[str, str]:
        """users.importSshPublicKey: `public_key` (OpenSSH form) in `account`'s login
        profile for `ttl_s` seconds. Returns (the account's POSIX user name in `project`,
        the key's fingerprint, for delete_ssh_key)."""
        from urllib.parse import quote

        expires = int((time.time() + ttl_s) * 1_000_000)
        out = self._oslogin(
            "POST", f"users/{quote(account, safe='@')}:importSshPublicKey",
            f"importSshPublicKey for {account}", params={"projectId": project},
            json={"key": public_key, "expirationTimeUsec": str(expires)})
        profile = out.get("loginProfile") or {}
        blob = public_key.split()[1]
        fp = next((f for f, k in (profile.get("sshPublicKeys") or {}).items()
                   if blob in (k.get("key") or "").split()), None)
        accounts = profile.get("posixAccounts") or []
        posix = (next((a for a in accounts if a.get("accountId") == project), None)
                 or next((a for a in accounts if a.get("primary")), None))
        if fp is None or posix is None or not posix.get("username"):
            raise OperationFailed(f"GCP OS Login importSshPublicKey for {account}: the login "
                                  f"profile holds no POSIX account for {project} or not the "
                                  "key; check that OS Login is on in the project")
        return posix["username"], fp

    def delete_ssh_key(self, account: str, fingerprint: str) -> None:
        from urllib.parse import quote

        try:
            self._oslogin("DELETE", f"users/{quote(account, safe='@')}/sshPublicKeys/"
                          f"{quote(fingerprint, safe='')}", f"delete key of {account}")
        except OperationFailed as e:
            if " 404 " not in str(e):  # gone already (expired): what was wanted
                raise

    def _monitoring(self, path: str, params: dict[str, Any], what: str) -> dict[str, Any]:
        """One Cloud Monitoring v3 GET."""
        return self.google_rest("GET", MONITORING_API, f"v3/{path}", what, api="Monitoring",
                                role="roles/monitoring.viewer", params=params)

    def google_rest(self, method: str, base: str, path: str, what: str, *, api: str,
                    role: str, **kw: Any) -> dict[str, Any]:
        """One call to a Google REST API read without a client library (Monitoring, Logging)
        through the session OS Login uses, at the endpoint override or `base`; an error
        becomes one line (403: the `role` the caller lacks)."""
        import requests

        session, _ = self._rest()
        try:
            r = session.request(method, f"{self._endpoint or base}/{path}",
                                timeout=self._timeout, **kw)
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP {api} {what}: {_one_line(e)}") from None
        if r.ok:
            answer: dict[str, Any] = r.json()
            return answer
        hint = f"; the caller needs {role} on the project" if r.status_code == 403 else ""
        raise OperationFailed(f"GCP {api} {what}: {r.status_code} "
                              f"{_one_line(_error_message(r))}{hint}")
