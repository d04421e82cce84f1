"""Compute Engine, OS Login, Monitoring and Logging plumbing for the GCP runtime: clients at
the endpoint given, retries with backoff, waits on long-running operations, and every failure
turned into one line naming the call. No policy: what poolctl does with a pool is in the
modules beside this one (`mig.py` finds and reads the pool's MIG; `ops.py` is `GcpOps`).

Endpoints: `client_options` (e.g. {"api_endpoint": "http://127.0.0.1:PORT"}; `make_ops`
passes `CloudEndpoints.gce_url`, which the CLI's edge reads from POOLCTL_GCE_ENDPOINT) point
the APIs (and OS Login's, for `nodes check --access iap`, and Cloud Monitoring's, for the
queue in `status`) elsewhere. Plain-http endpoints get anonymous credentials: a token must
never travel unencrypted, and only a local fake speaks plain http. Every mutation waits for
its Operation through a Region/GlobalOperationsClient built with the same options: the
clients' own polling builds a default client that would miss the endpoint.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from poolctl.adaptors.gcp import (
    api_exceptions,
    api_retry,
    auth,
    auth_credentials,
    auth_exceptions,
    auth_requests,
    cloudquotas_v1,
    compute_v1,
    requests,
    service_account,
)
from poolctl.endpoints import GCE_ENDPOINT_ENV
from poolctl.errors import OperationFailed, UsageError

OSLOGIN_API = "https://oslogin.googleapis.com"
MONITORING_API = "https://monitoring.googleapis.com"
TOKENINFO = "https://oauth2.googleapis.com/tokeninfo"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
WAIT_CALL_S = 150.0  # operations.wait answers within about 2 minutes, done or not


def link_name(link: str) -> str:
    """The name at the end of a self link (`...?uniqueId=` from `self_link_unique` dropped)."""
    return link.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] if link else ""


def link_zone(instance_link: str) -> str:
    """The zone of an instance's self link ("" when it names none)."""
    m = re.search(r"/zones/([^/]+)/", instance_link or "")
    return m.group(1) if m else ""


def created_at(resource: Any) -> datetime:
    """A resource's creation time (its `creation_timestamp`); the earliest time if unreadable."""
    try:
        return datetime.fromisoformat(resource.creation_timestamp)
    except ValueError:
        return datetime.min


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


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
            credentials = auth_credentials.AnonymousCredentials()
        self._client_options = client_options
        self._credentials = credentials
        self._retry_initial_s = retry_initial_s
        self._retry_deadline_s = retry_deadline_s
        self._timeout = call_timeout_s
        self._operation_timeout_s = operation_timeout_s
        self._clients: dict[str, Any] = {}
        self._rest_session: tuple[Any, str] | None = None
        self._endpoint = endpoint.rstrip("/")
        self._retry_obj: Any = None  # a google.api_core Retry, made on first use

    # ------------------------------------------------------------------ plumbing

    def client(self, name: str) -> Any:
        """The client class `name` of compute_v1 (or CloudQuotasClient), made once."""
        if name not in self._clients:
            self._clients[name] = self._build(name)
        return self._clients[name]

    def _build(self, name: str) -> Any:
        try:
            module = cloudquotas_v1 if name == "CloudQuotasClient" else compute_v1
            return getattr(module, name)(credentials=self._credentials,
                                         client_options=self._client_options,
                                         transport="rest")
        except auth_exceptions.DefaultCredentialsError:
            raise UsageError(
                "GCP credentials: none found; run `gcloud auth application-default login` "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
            ) from None

    def _retry(self) -> Any:
        if self._retry_obj is None:
            gexc = api_exceptions
            # 429, 5xx and dropped connections are transient; mutations carry a request id,
            # so a retried patch is not applied twice.
            self._retry_obj = api_retry.Retry(
                predicate=api_retry.if_exception_type(
                    gexc.TooManyRequests, gexc.ResourceExhausted, gexc.InternalServerError,
                    gexc.BadGateway, gexc.ServiceUnavailable, gexc.GatewayTimeout,
                    requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                ),
                initial=self._retry_initial_s, maximum=30.0 * self._retry_initial_s,
                multiplier=2.0, timeout=self._retry_deadline_s,
            )
        return self._retry_obj

    def call(self, what: str, fn: Callable[..., Any], *, not_found_ok: bool = False,
             timeout: float | None = None, **kw: Any) -> Any:
        """One API call (lists: the whole pager) with retries; failures become one line.
        NotFound is raised as is when the caller has its own words for it."""
        gexc = api_exceptions
        try:
            out = fn(**kw, retry=self._retry(), timeout=timeout or self._timeout)
            if hasattr(out, "pages"):  # a pager: fetch every page inside the error handling
                out = list(out)
            return out
        except gexc.RetryError as e:
            cause = e.cause.message if isinstance(e.cause, gexc.GoogleAPICallError) else (
                e.cause or e)
            raise OperationFailed(f"GCP {what}: still failing after retries "
                                  f"({one_line(cause)})") from None
        except gexc.NotFound as e:
            if not_found_ok:
                raise
            raise OperationFailed(f"GCP {what}: 404 {one_line(e.message)}") from None
        except gexc.GoogleAPICallError as e:
            raise OperationFailed(f"GCP {what}: {e.code} {one_line(e.message)}") from None
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP {what}: {one_line(e)}") from None

    def lookup(self, what: str, fn: Callable[..., Any], **kw: Any) -> Any:
        """`call` for callers that turn NotFound (api_exceptions.NotFound) into words of
        their own."""
        return self.call(what, fn, not_found_ok=True, **kw)

    def wait(self, op: Any, project: str, region: str | None, what: str,
             zone: str | None = None) -> None:
        """Wait for a region operation (a zone one with `zone`, a global one with neither)
        through the injected operations client."""
        where: dict[str, Any]
        if zone is not None:
            ops, where = self.client("ZoneOperationsClient"), {"zone": zone}
            scope = f"--zone {zone}"
        elif region is None:
            ops, where, scope = self.client("GlobalOperationsClient"), {}, "--global"
        else:
            ops, where = self.client("RegionOperationsClient"), {"region": region}
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
            op = self.call(what, ops.wait, timeout=WAIT_CALL_S, project=project,
                           operation=op.name, **where)
        if op.error.errors:
            detail = "; ".join(f"{e.code}: {one_line(e.message)}" for e in op.error.errors)
            raise OperationFailed(f"GCP {what}: {detail}")

    # ------------------------------------------------------------------ nodes check

    def running_instances(self, project: str, filter: str) -> list[tuple[str, Any]]:
        """instances.aggregatedList under `filter`: (zone key, InstancesScopedList) of every
        page, through the endpoint override like every other call."""
        scoped: list[tuple[str, Any]] = self.call(
            f"list instances of {project}", self.client("InstancesClient").aggregated_list,
            request=compute_v1.AggregatedListInstancesRequest(project=project, filter=filter))
        return scoped

    def serial_output(self, project: str, zone: str, instance: str) -> str:
        """The VM's first serial port, as much as GCE keeps (the newest 1 MB): the boot
        script logs to the console, which is this port."""
        out = self.call(f"read the serial port of {instance}",
                        self.client("InstancesClient").get_serial_port_output,
                        request=compute_v1.GetSerialPortOutputInstanceRequest(
                            project=project, zone=zone, instance=instance, port=1))
        return str(out.contents or "")

    def _rest(self) -> tuple[Any, str]:
        """(AuthorizedSession, base URL) for OS Login, which has no client library here:
        the endpoint override (anonymous, as above) or Google's."""
        if self._rest_session is None:
            creds, base = self._credentials, self._endpoint or OSLOGIN_API
            if creds is None:
                try:
                    creds, _ = auth.default(scopes=[CLOUD_PLATFORM])
                except auth_exceptions.DefaultCredentialsError:
                    raise UsageError(
                        "GCP credentials: none found; run `gcloud auth application-default "
                        "login` or set GOOGLE_APPLICATION_CREDENTIALS") from None
            self._rest_session = (auth_requests.AuthorizedSession(creds), base)
        return self._rest_session

    def caller_account(self) -> str:
        """The email of the Google account poolctl acts as: OS Login keys are imported for
        it. A service account names itself; user credentials are asked of Google
        (tokeninfo). Against a plain-http endpoint (a local fake) it can only come from a key
        file (GOOGLE_APPLICATION_CREDENTIALS): no token may leave the machine."""
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
                try:
                    email = service_account.Credentials.from_service_account_file(
                        path).service_account_email
                except (OSError, ValueError, KeyError) as e:
                    raise UsageError(f"GOOGLE_APPLICATION_CREDENTIALS={path}: not a service "
                                     f"account key file ({one_line(e)})") from None
            else:
                creds = session.credentials
                email = _email_of(creds)
                if email is None:
                    # Compute Engine credentials learn their email with their first token;
                    # user credentials never carry it.
                    creds.refresh(auth_requests.Request())
                    email = _email_of(creds)
                if email is None:
                    r = session.post(TOKENINFO, data={"access_token": creds.token},
                                     timeout=self._timeout)
                    email = r.json().get("email") if r.ok else None
        except (requests.exceptions.RequestException, ValueError) as e:
            raise UsageError(f"--access iap: cannot ask Google for the account "
                             f"({one_line(e)}); {fix}") from None
        except auth_exceptions.GoogleAuthError as e:
            raise UsageError(f"--access iap: cannot read the Google account ({one_line(e)}); "
                             f"{fix}") from None
        if not email:
            raise UsageError(f"--access iap: cannot tell which Google account poolctl acts "
                             f"as; {fix}")
        return email

    def _oslogin(self, method: str, path: str, what: str, **kw: Any) -> dict[str, Any]:
        """One OS Login call; an error becomes one line (403: the role that is missing)."""
        session, base = self._rest()
        try:
            r = session.request(method, f"{base}/v1/{path}", timeout=self._timeout, **kw)
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP OS Login {what}: {one_line(e)}") from None
        if r.ok:
            answer: dict[str, Any] = r.json() if r.content.strip() else {}
            return answer
        hint = ("; the caller needs roles/compute.osAdminLogin (or osLogin) on the project"
                if r.status_code == 403 else "")
        raise OperationFailed(f"GCP OS Login {what}: {r.status_code} "
                              f"{one_line(_error_message(r))}{hint}")

    def import_ssh_key(self, account: str, public_key: str, project: str,
                       ttl_s: float) -> tuple[str, str]:
        """users.importSshPublicKey: `public_key` (OpenSSH form) in `account`'s login
        profile for `ttl_s` seconds. Returns (the account's POSIX user name in `project`,
        the key's fingerprint, for delete_ssh_key)."""
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
        try:
            self._oslogin("DELETE", f"users/{quote(account, safe='@')}/sshPublicKeys/"
                          f"{quote(fingerprint, safe='')}", f"delete key of {account}")
        except OperationFailed as e:
            if " 404 " not in str(e):  # gone already (expired): what was wanted
                raise

    def monitoring(self, path: str, params: dict[str, Any], what: str) -> dict[str, Any]:
        """One Cloud Monitoring v3 GET."""
        return self.google_rest("GET", MONITORING_API, f"v3/{path}", what, api="Monitoring",
                                role="roles/monitoring.viewer", params=params)

    def google_rest(self, method: str, base: str, path: str, what: str, *, api: str,
                    role: str, **kw: Any) -> dict[str, Any]:
        """One call to a Google REST API read without a client library (Monitoring, Logging)
        through the session OS Login uses, at the endpoint override or `base`; an error
        becomes one line (403: the `role` the caller lacks)."""
        session, _ = self._rest()
        try:
            r = session.request(method, f"{self._endpoint or base}/{path}",
                                timeout=self._timeout, **kw)
        except requests.exceptions.RequestException as e:
            raise OperationFailed(f"GCP {api} {what}: {one_line(e)}") from None
        if r.ok:
            answer: dict[str, Any] = r.json()
            return answer
        hint = f"; the caller needs {role} on the project" if r.status_code == 403 else ""
        raise OperationFailed(f"GCP {api} {what}: {r.status_code} "
                              f"{one_line(_error_message(r))}{hint}")
