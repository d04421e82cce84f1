"""Service Quotas for ec2 (`quota check/request`).

moto knows only service `vpc`. Added for ServiceCode `ec2`: L-1216C47A (Standard), L-DB2E81BA
(G and VT), L-417A185B (P), in vCPUs: GetServiceQuota, ListServiceQuotas,
GetAWSDefaultServiceQuota, RequestServiceQuotaIncrease (status PENDING, an Id; a second open
request for the same quota is ResourceAlreadyExistsException; a DesiredValue not above the
current value is IllegalArgumentException), ListRequestedServiceQuotaChangeHistory,
ListRequestedServiceQuotaChangeHistoryByQuota, GetRequestedServiceQuotaChange.
Applied values: SANDBOX_GRANTS (enough for the examples; else the AWS defaults in
EC2_QUOTAS) unless set by the POOLCTL_SANDBOX_QUOTAS env var (JSON {"L-417A185B": 384}) at
start, or by the admin endpoint (admin.py) at run time.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from poolctl.sandbox.extensions.common import LOCK, all_backends, stored

NAMES = ("service-quotas.ec2",)

EC2_QUOTAS: dict[str, dict[str, Any]] = {
    "L-1216C47A": {
        "QuotaName": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
        "Class": "Standard/OnDemand",
        "Default": 5.0,
    },
    "L-DB2E81BA": {
        "QuotaName": "Running On-Demand G and VT instances",
        "Class": "G/OnDemand",
        "Default": 0.0,
    },
    "L-417A185B": {
        "QuotaName": "Running On-Demand P instances",
        "Class": "P/OnDemand",
        "Default": 0.0,
    },
}
_OPEN_REQUEST = ("PENDING", "CASE_OPENED")
_REQUEST_STATUSES = (
    "PENDING", "CASE_OPENED", "APPROVED", "DENIED", "CASE_CLOSED", "NOT_APPROVED",
    "INVALID_REQUEST",
)


def _env_quotas() -> dict[str, float]:
    raw = os.environ.get("POOLCTL_SANDBOX_QUOTAS", "").strip()
    if not raw:
        return {}
    values = json.loads(raw)
    return {str(k): float(v) for k, v in values.items()}


# Applied quota values: {region or "*": {quota code: value}}; "*" applies to every region.
# Changed in place only (snapshots.py copies and restores it).
applied_values: dict[str, dict[str, float]] = {}


# What the sandbox grants at start-up unless POOLCTL_SANDBOX_QUOTAS says otherwise: enough
# for the examples' peaks (llama-70b-p5: (6 + 1) x 192 = 1344 P vCPUs) with room for `warm`,
# so a first `deploy --sandbox` passes its quota check. AWS's own defaults (0 for G and P,
# GetAWSDefaultServiceQuota) stay in EC2_QUOTAS.
SANDBOX_GRANTS: dict[str, float] = {"L-417A185B": 2304.0, "L-DB2E81BA": 2304.0}


def reset() -> None:
    """The applied values as at start: SANDBOX_GRANTS, POOLCTL_SANDBOX_QUOTAS over them."""
    applied_values.clear()
    applied_values["*"] = {**SANDBOX_GRANTS, **_env_quotas()}


def set_quotas(values: dict[str, Any], region: str | None = None) -> None:
    for code, value in values.items():
        if code not in EC2_QUOTAS:
            raise ValueError(f"unknown ec2 quota code {code!r}: known {', '.join(EC2_QUOTAS)}")
        applied_values.setdefault(region or "*", {})[code] = float(value)


def applied_quota(region: str, code: str) -> float:
    for scope in (region, "*"):
        if code in applied_values.get(scope, {}):
            return applied_values[scope][code]
    return float(EC2_QUOTAS[code]["Default"])


def _quota_error(kind: str, message: str) -> Exception:
    from moto.core.exceptions import JsonRESTError

    return JsonRESTError(kind, message)


def _no_such_quota(code: str) -> Exception:
    return _quota_error(
        "NoSuchResourceException", f"The request failed because the specified quota {code} "
        "does not exist."
    )


def _ec2_quota(backend: Any, code: str, value: float) -> dict[str, Any]:
    info = EC2_QUOTAS[code]
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{backend.region_name}:{backend.account_id}:ec2/{code}",
        "QuotaCode": code,
        "QuotaName": info["QuotaName"],
        "Value": value,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
        "UsageMetric": {
            "MetricNamespace": "AWS/Usage",
            "MetricName": "ResourceCount",
            "MetricDimensions": {
                "Class": info["Class"], "Resource": "vCPU", "Service": "EC2", "Type": "Resource",
            },
            "MetricStatisticRecommendation": "Maximum",
        },
        "QuotaAppliedAtLevel": "ACCOUNT",
        "Description": f"Maximum number of vCPUs assigned to the {info['QuotaName']}.",
    }


def _applied_list(backend: Any, service: str) -> list[dict[str, Any]]:
    if service == "ec2":
        return [_ec2_quota(backend, c, applied_quota(backend.region_name, c)) for c in EC2_QUOTAS]
    return list(backend.list_aws_default_service_quotas(service))


def _sq_params(self: Any) -> dict[str, Any]:
    params: dict[str, Any] = json.loads(self.body or "{}")
    return params


def _sq_get_service_quota(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service == "ec2":
        if code not in EC2_QUOTAS:
            raise _no_such_quota(code)
        quota = _ec2_quota(self.backend, code, applied_quota(self.region, code))
    else:
        quota = self.backend.get_service_quota(service_code=service, quota_code=code)
    return json.dumps({"Quota": quota})


def _sq_get_aws_default_service_quota(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service == "ec2":
        if code not in EC2_QUOTAS:
            raise _no_such_quota(code)
        quota = _ec2_quota(self.backend, code, float(EC2_QUOTAS[code]["Default"]))
    else:
        quota = self.backend.get_service_quota(service_code=service, quota_code=code)
    return json.dumps({"Quota": quota})


def _sq_list_aws_default_service_quotas(self: Any) -> str:
    p = _sq_params(self)
    service = str(p.get("ServiceCode"))
    if service == "ec2":
        quotas = [
            _ec2_quota(self.backend, c, float(EC2_QUOTAS[c]["Default"])) for c in EC2_QUOTAS
        ]
    else:
        quotas = self.backend.list_aws_default_service_quotas(service)
    return json.dumps({"Quotas": quotas})


def _sq_list_service_quotas(self: Any) -> str:
    p = _sq_params(self)
    quotas = _applied_list(self.backend, str(p.get("ServiceCode")))
    if p.get("QuotaCode"):
        quotas = [q for q in quotas if q["QuotaCode"] == p["QuotaCode"]]
    return json.dumps({"Quotas": quotas})


def _quota_requests(backend: Any) -> list[dict[str, Any]]:
    return stored(backend, "_poolctl_quota_requests", list)


def _sq_request_service_quota_increase(self: Any) -> str:
    p = _sq_params(self)
    service, code = str(p.get("ServiceCode")), str(p.get("QuotaCode"))
    if service != "ec2" or code not in EC2_QUOTAS:
        raise _no_such_quota(code)
    try:
        desired = float(p["DesiredValue"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _quota_error("IllegalArgumentException", "DesiredValue must be a number") from exc
    current = applied_quota(self.region, code)
    if desired <= current:
        raise _quota_error(
            "IllegalArgumentException",
            f"Invalid input: the desired value {desired:g} must be greater than the current "
            f"value {current:g}.",
        )
    requests = _quota_requests(self.backend)
    if any(
        r["ServiceCode"] == service and r["QuotaCode"] == code and r["Status"] in _OPEN_REQUEST
        for r in requests
    ):
        raise _quota_error(
            "ResourceAlreadyExistsException",
            f"A quota increase request for {service}/{code} is already open.",
        )
    stamp = time.time()
    quota = _ec2_quota(self.backend, code, current)
    request = {
        "Id": uuid.uuid4().hex,
        "ServiceCode": service,
        "ServiceName": quota["ServiceName"],
        "QuotaCode": code,
        "QuotaName": quota["QuotaName"],
        "DesiredValue": desired,
        "Status": "PENDING",
        "Created": stamp,
        "LastUpdated": stamp,
        "Requester": json.dumps(
            {"accountId": self.backend.account_id,
             "callerArn": f"arn:aws:iam::{self.backend.account_id}:root"}
        ),
        "QuotaArn": quota["QuotaArn"],
        "GlobalQuota": False,
        "Unit": "None",
        "QuotaRequestedAtLevel": "ACCOUNT",
    }
    requests.append(request)
    return json.dumps({"RequestedQuota": request})


def _filter_requests(self: Any, by_quota: bool) -> str:
    p = _sq_params(self)
    out = list(_quota_requests(self.backend))
    if p.get("ServiceCode"):
        out = [r for r in out if r["ServiceCode"] == p["ServiceCode"]]
    if by_quota:
        out = [r for r in out if r["QuotaCode"] == p.get("QuotaCode")]
    if p.get("Status"):
        out = [r for r in out if r["Status"] == p["Status"]]
    return json.dumps({"RequestedQuotas": out})


def _sq_list_history(self: Any) -> str:
    return _filter_requests(self, by_quota=False)


def _sq_list_history_by_quota(self: Any) -> str:
    return _filter_requests(self, by_quota=True)


def _sq_get_requested_change(self: Any) -> str:
    request_id = _sq_params(self).get("RequestId")
    for r in _quota_requests(self.backend):
        if r["Id"] == request_id:
            return json.dumps({"RequestedQuota": r})
    raise _quota_error(
        "NoSuchResourceException", f"The request {request_id} does not exist."
    )


def set_request_status(request_id: str, status: str) -> dict[str, Any]:
    from moto.servicequotas.models import servicequotas_backends

    if status not in _REQUEST_STATUSES:
        raise ValueError(f"status must be one of {', '.join(_REQUEST_STATUSES)}")
    for backend in all_backends(servicequotas_backends):
        for r in _quota_requests(backend):
            if r["Id"] == request_id:
                r["Status"], r["LastUpdated"] = status, time.time()
                if status == "APPROVED":
                    set_quotas({r["QuotaCode"]: r["DesiredValue"]}, backend.region_name)
                return r
    raise KeyError(request_id)


def install() -> None:
    from moto.servicequotas.responses import ServiceQuotasResponse

    # Service Quotas: ec2 next to moto's vpc.
    orig_sq_call = ServiceQuotasResponse.call_action

    def sq_call_action(self: Any) -> Any:
        with LOCK:
            return orig_sq_call(self)

    ServiceQuotasResponse.call_action = sq_call_action  # type: ignore[method-assign]  # moto extension: under the lock
    for name, fn in {
        "get_service_quota": _sq_get_service_quota,
        "get_aws_default_service_quota": _sq_get_aws_default_service_quota,
        "list_aws_default_service_quotas": _sq_list_aws_default_service_quotas,
        "list_service_quotas": _sq_list_service_quotas,
        "request_service_quota_increase": _sq_request_service_quota_increase,
        "list_requested_service_quota_change_history": _sq_list_history,
        "list_requested_service_quota_change_history_by_quota": _sq_list_history_by_quota,
        "get_requested_service_quota_change": _sq_get_requested_change,
    }.items():
        setattr(ServiceQuotasResponse, name, fn)
    reset()
