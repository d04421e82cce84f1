"""A local fake of the Compute Engine v1 REST API and of Cloud Quotas v1 quota preferences.

Compute Engine has no emulator. This server answers exactly the calls `poolctl.clouds.gcp`
makes, with the JSON shapes of the real API (camelCase, int64 as strings, self links on
www.googleapis.com), so the real `google-cloud-compute` / `google-cloud-quotas` clients talk
to it over HTTP on 127.0.0.1:

    regions.get (quotas), projects.get (quotas), instanceTemplates.list/get/delete (global,
    as the stack creates them), regionInstanceGroupManagers.list/get/patch/
    listManagedInstances/resize, regionAutoscalers.list/get/patch/update, regionOperations.get/wait,
    globalOperations.get/wait, instances.aggregatedList (the MIGs' VMs, `filter` on labels and
    status), images.list (`filter` on labels)/get/delete (node images, seeded with
    `add_image`, as `poolctl image build` leaves them),
    Cloud Quotas projects.locations.quotaPreferences.list/get/create/patch,
    OS Login users.importSshPublicKey and users.sshPublicKeys.delete (v1, same host),
    Cloud Monitoring projects.timeSeries.list (v3, same host; points seeded with
    `write_point`, or written by projects.timeSeries.create as the nodes' boot script writes
    them: GAUGE and CUMULATIVE points, INT64, DOUBLE and DISTRIBUTION values; `list` with
    aggregation: ALIGN_DELTA / ALIGN_MEAN per series, REDUCE_SUM / REDUCE_MEAN across
    them, in the API's shapes), forwardingRules.list (regional,
    `add_forwarding_rule`), Cloud Logging entries.list (v2, same host; `write_log`),
and, standing in for the node's side of OS Login (the guest agent's AuthorizedKeysCommand
asking the metadata server), `GET /_poolctl/instance-connect?instance_id=NAME&user=POSIX`: the
unexpired keys of the account with that POSIX user name, for a running VM of that name. It is
the path tests/ops/sshd.py's AuthorizedKeysCommand asks, as it asks the AWS sandbox.

The client libraries parse responses with `ignore_unknown_fields=True`, so a misspelt field
would pass silently and read as empty. With `strict=True` (the default) every response, and
every request body, is first parsed against its `google.cloud.compute_v1` /
`cloudquotas_v1` message with unknown fields refused (OS Login, whose client library is not
installed: against the field names of its v1 REST reference, OSLOGIN_FIELDS); a mismatch
answers 500 and lands in `fake.errors`, which the tests check is empty.

Behaviour worth knowing:
- Mutations answer an Operation that goes PENDING -> RUNNING -> DONE, one step per
  operations.get / operations.wait call; the change itself is applied when the operation
  reaches DONE, as a caller that does not wait would see on the real API.
- Lists are paged (`page_size`, default 2), so callers must follow nextPageToken.
- The MIG reconciles like a standby-pool MIG (SCALE_OUT_POOL): growing targetSize starts
  stopped standby VMs first, then creates; the standby pool is refilled up to
  targetStoppedSize with VMs headed for STOPPED. New VMs sit in CREATING until the test
  calls `settle()` (or marks them itself): nothing happens on a timer.
- A patch of `versions` starts a rollout: up to maxSurge VMs not on their version's template
  show RECREATING; `step_rollout()` replaces them. Two versions are a canary: the one with a
  `targetSize` (fixed, or percent of the group's targetSize rounded up, as the API reference
  of compute v1 said until 2022; today's says "rounded") gets that many VMs, serving VMs
  first, the other version the rest (standby VMs included); `targetSize.calculated` is
  rendered. The patch is refused as GCE refuses it: more than two versions, not exactly one
  without a targetSize, names or templates repeated.
- New VMs of a rollout step come up HEALTHY (`step_rollout(..., settled=True)`), or sit in
  CREATING until `settle()` so that a caller sees the canary not yet healthy.
- instanceTemplates.delete refuses (400 resourceInUseByAnotherResource) a template a MIG's
  versions reference, as GCE does; one only VMs run can be deleted.
- `fail_next()` answers the next matching requests with an HTTP error (429/5xx to test
  retries); `fail_next_operation()` makes the next matching mutation end DONE with an error.
- Capacity: `set_capacity(zone, machine_type, n)` caps the VMs of a machine type a zone runs
  On-Demand (running, or being created or started: a stopped VM holds none, so starting a
  standby VM takes capacity again). A VM that finds no room stays in its action (CREATING,
  without an instanceStatus: it does not exist yet; or STARTING), its `lastAttempt.errors`
  and the MIG's `listErrors` (regionInstanceGroupManagers.listErrors, newest first) carrying
  `ZONE_RESOURCE_POOL_EXHAUSTED`, "The zone 'projects/P/zones/Z' does not have enough
  resources available to fulfill the request.  Try a different zone, or try again later."
  (the message as GCE writes it, quoted e.g. by skypilot and kubernetes/autoscaler); it
  tries again on `settle()`. Once capacity is limited or reserved anywhere, a new VM's zone
  follows the MIG's distributionPolicy.targetShape (the compute docs' regional MIG target
  distribution shape): EVEN keeps zones even and waits for a stocked-out zone; BALANCED
  creates where there is room, fewest VMs first, and a held-back VM moves there on retry;
  ANY fills unused reservations first, then any zone with room; ANY_SINGLE_ZONE puts every
  VM in one zone (reservations, then room, decide which). Unconstrained, zones are taken in
  turn as before.
- Reservations: compute reservations.list/get/insert/delete (zonal; operations on
  zoneOperations.get/wait) and reservations.aggregatedList; `add_reservation` seeds one. A
  VM consumes one per its template's reservationAffinity (ANY_RESERVATION by default: any
  READY matching reservation not specificReservationRequired, else On-Demand;
  SPECIFIC_RESERVATION: the named one in its zone or the creation fails, code
  CONDITION_NOT_MET with the messages kubernetes/autoscaler matches, the code itself not
  documented; NO_RESERVATION), matching machine type, and GPUs and local SSD count where the
  reservation names them. inUseCount counts the VMs running in it; they do not count against
  the zone's limit. Not emulated: a reservation taking capacity from its zone (insert never
  fails for capacity), shared and aggregate reservations, reservations.resize/update.
- Instance flexibility: a MIG's `instanceFlexibilityPolicy` (deploy_pool's
  `fallback_machine_types`) lets a VM being created take the first machine type, by rank,
  that has a reservation or room in its zone (BALANCED counts a zone with room for any of
  them); the managed instance then reports `propertiesFromFlexibilityPolicy.machineType`,
  and its instance that type.
- Calendar mode: advice.calendarMode (regional) recommends, per spec, the first allowed zone
  whose `set_capacity` limit leaves room, from the earliest start asked for, for the shortest
  duration; futureReservations.insert/get (zonal) keep a request in the state
  `future_reservation_state` (PENDING_APPROVAL unless a test sets another).
- machineTypes.get (zonal): every machine type is offered in every zone of a region, but
  those `withdraw_offer` takes back, which answer 404 as GCE answers a type a zone lacks.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from poolctl import naming
from poolctl.cloud import Cloud

API = "https://www.googleapis.com/compute/v1"
BASE_TIME = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

ACTIONS = ("abandoning", "creating", "creatingWithoutRetries", "deleting", "none",
           "recreating", "refreshing", "restarting", "resuming", "starting", "stopping",
           "suspending", "verifying")
_ACTION_KEY = {
    "CREATING_WITHOUT_RETRIES": "creatingWithoutRetries",
}

# Compute metric -> (Cloud Quotas quota id, dimensions other than region), for grant().
GPU_FAMILY_QUOTA = "GPUS-PER-GPU-FAMILY-per-project-region"


def _metric_of(quota_id: str, dims: dict[str, str]) -> str | None:
    if quota_id == GPU_FAMILY_QUOTA and "gpu_family" in dims:
        return f"{dims['gpu_family']}_GPUS"
    return {
        "CPUS-per-project-region": "CPUS",
        "LOCAL-SSD-TOTAL-GB-per-project-region": "LOCAL_SSD_TOTAL_GB",
        "GPUS-ALL-REGIONS-per-project": "GPUS_ALL_REGIONS",
    }.get(quota_id)


class HttpError(Exception):
    def __init__(self, code: int, message: str, reason: str = "invalid",
                 status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code, self.message, self.reason, self.status = code, message, reason, status

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "status": self.status,
                          "errors": [{"message": self.message, "domain": "global",
                                      "reason": self.reason}]}}


def _not_found(what: str) -> HttpError:
    return HttpError(404, f"The resource '{what}' was not found", "notFound", "NOT_FOUND")


def _merge(target: dict, patch: dict) -> None:
    """RFC 7396 JSON merge patch, as Compute Engine applies PATCH bodies."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _last(link: str) -> str:
    return link.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


@dataclass
class _Failure:
    method: str
    pattern: re.Pattern
    status: int
    times: int


class FakeGce:
    """The fake's state and its plain Python API; `start()` serves it over HTTP."""

    def __init__(self, *, strict: bool = True, page_size: int = 2) -> None:
        self.strict = strict
        self.page_size = page_size
        self.lock = threading.RLock()
        self.projects: dict[str, dict] = {}
        self.regions: dict[tuple[str, str], dict] = {}
        self.templates: dict[tuple[str, str], dict] = {}
        self.images: dict[tuple[str, str], dict] = {}  # (project, name) -> Image JSON
        self.migs: dict[tuple[str, str, str], dict] = {}
        self.managed: dict[tuple[str, str, str], list[dict]] = {}
        self.autoscalers: dict[tuple[str, str, str], dict] = {}
        # (project, region or None for a global operation, name)
        self.operations: dict[tuple[str, str | None, str], dict] = {}
        self.preferences: dict[str, dict] = {}  # full name -> QuotaPreference JSON
        self.ips: dict[str, str] = {}  # instance name -> internal IP (instances.aggregatedList)
        # account email -> {"username": POSIX user, "uid": ..., "keys": {fingerprint: key}}
        self.os_login: dict[str, dict] = {}
        self.time_series: list[dict] = []  # Cloud Monitoring TimeSeries JSON, points newest first
        self.forwarding_rules: dict[tuple[str, str, str], dict] = {}
        self.log_entries: list[dict] = []  # Cloud Logging LogEntry JSON (`write_log`)
        self.serial: dict[str, str] = {}  # instance name -> its serial port 1 (`write_serial`)
        # (zone, machine type) -> how many VMs of the type the zone runs On-Demand
        self.capacity: dict[tuple[str, str], int] = {}
        self.reservations: dict[tuple[str, str, str], dict] = {}  # (project, zone, name)
        # (zone, machine type) a zone does not offer (`withdraw_offer`); others are offered
        self.not_offered: set[tuple[str, str]] = set()
        # (project, zone, name) -> FutureReservation JSON; the state a new request gets
        self.future_reservations: dict[tuple[str, str, str], dict] = {}
        self.future_reservation_state = "PENDING_APPROVAL"
        self.mig_errors: dict[tuple[str, str, str], list[dict]] = {}  # listErrors, oldest first
        self._consumes: dict[str, tuple[str, str, str] | None] = {}  # VM -> its reservation
        self._waiting: dict[str, str] = {}  # VM -> the action (CREATING, STARTING) held back
        self.requests: list[dict] = []
        self.errors: list[str] = []
        self._failures: list[_Failure] = []
        self._op_failures: list[tuple[re.Pattern, str, str]] = []  # (target, code, message)
        self._effects: dict[tuple[str, str | None, str], Any] = {}
        self._ids = itertools.count(4_100_000_000_000_000_001)
        self._clock = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ serving

    def start(self) -> FakeGce:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll keeps stop() quick (serve_forever checks for shutdown every poll).
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True,
                                        name="fake-gce")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGce:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        assert self._server, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------------ seeding

    def _id(self) -> str:
        return str(next(self._ids))

    def _now(self) -> datetime:
        return BASE_TIME + timedelta(minutes=next(self._clock))

    def add_project(self, project: str, quotas: dict[str, tuple[float, float]] | None = None):
        with self.lock:
            p = self.projects.setdefault(project, {
                "kind": "compute#project", "id": self._id(), "name": project,
                "creationTimestamp": _ts(BASE_TIME),
                "selfLink": f"{API}/projects/{project}",
                "commonInstanceMetadata": {"kind": "compute#metadata",
                                           "fingerprint": "x0aMWRV2eyY=", "items": []},
                "defaultServiceAccount": f"123-compute@{project}.iam.gserviceaccount.com",
                "defaultNetworkTier": "PREMIUM",
                "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
                "vmDnsSetting": "ZONAL_ONLY", "quotas": [],
            })
            for metric, (limit, usage) in (quotas or {}).items():
                self._set_quota(p["quotas"], metric, limit, usage)
            return p

    def add_region(self, project: str, region: str, zones: list[str],
                   quotas: dict[str, tuple[float, float]] | None = None) -> dict:
        with self.lock:
            self.add_project(project)
            r = self.regions.setdefault((project, region), {
                "kind": "compute#region", "id": self._id(), "name": region,
                "creationTimestamp": _ts(BASE_TIME), "description": region, "status": "UP",
                "zones": [f"{API}/projects/{project}/zones/{z}" for z in zones],
                "quotas": [], "selfLink": f"{API}/projects/{project}/regions/{region}",
                "supportsPzs": False,
            })
            for metric, (limit, usage) in (quotas or {}).items():
                self._set_quota(r["quotas"], metric, limit, usage)
            return r

    @staticmethod
    def _set_quota(quotas: list[dict], metric: str, limit: float, usage: float) -> None:
        for q in quotas:
            if q["metric"] == metric:
                q.update(limit=float(limit), usage=float(usage))
                return
        quotas.append({"metric": metric, "limit": float(limit), "usage": float(usage)})

    def set_region_quota(self, project: str, region: str, metric: str, limit: float,
                         usage: float = 0) -> None:
        with self.lock:
            self._set_quota(self.regions[(project, region)]["quotas"], metric, limit, usage)

    def set_project_quota(self, project: str, metric: str, limit: float, usage: float = 0):
        with self.lock:
            self._set_quota(self.add_project(project)["quotas"], metric, limit, usage)

    def add_template(self, project: str, name: str, *, labels: dict[str, str] | None = None,
                     machine_type: str = "a3-highgpu-8g", description: str = "") -> dict:
        with self.lock:
            self.add_project(project)
            t = {
                "kind": "compute#instanceTemplate", "id": self._id(), "name": name,
                "description": description, "creationTimestamp": _ts(self._now()),
                "selfLink": f"{API}/projects/{project}/global/instanceTemplates/{name}",
                "properties": {
                    "machineType": machine_type,
                    "labels": dict(labels or {}),
                    "canIpForward": False,
                    "disks": [{"kind": "compute#attachedDisk", "type": "PERSISTENT",
                               "mode": "READ_WRITE", "boot": True, "autoDelete": True,
                               "deviceName": "persistent-disk-0",
                               "initializeParams": {"diskType": "pd-ssd", "diskSizeGb": "200",
                                                    "labels": dict(labels or {})}}],
                    "networkInterfaces": [{"kind": "compute#networkInterface",
                                           "network": f"{API}/projects/{project}/global/"
                                                      "networks/default",
                                           "nicType": "GVNIC"}],
                    "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": True,
                                   "preemptible": False, "provisioningModel": "STANDARD"},
                    "shieldedInstanceConfig": {"enableSecureBoot": True, "enableVtpm": True,
                                               "enableIntegrityMonitoring": True},
                    "tags": {"items": [f"{name}-node"]},
                },
            }
            self.templates[(project, name)] = t
            return t

    def add_image(self, project: str, name: str, *, labels: dict[str, str] | None = None,
                  family: str = "", created: datetime | None = None) -> dict:
        """A READY image as a googlecompute build leaves it (Packer's `image_labels`,
        `image_family`, an encrypted-at-rest disk image of the builder's boot disk)."""
        with self.lock:
            self.add_project(project)
            im = {
                "kind": "compute#image", "id": self._id(), "name": name,
                "creationTimestamp": _ts(created or self._now()),
                "description": f"poolctl image {name}", "sourceType": "RAW",
                "status": "READY", "archiveSizeBytes": "21474836480", "diskSizeGb": "200",
                "sourceDisk": f"{API}/projects/{project}/zones/us-central1-a/disks/"
                              f"packer-{self._id()}",
                "sourceDiskId": self._id(), "family": family, "labels": dict(labels or {}),
                "labelFingerprint": "42WmSpB8rSM=", "storageLocations": ["us"],
                "architecture": "X86_64",
                "guestOsFeatures": [{"type": "UEFI_COMPATIBLE"}, {"type": "GVNIC"}],
                "selfLink": f"{API}/projects/{project}/global/images/{name}",
            }
            self.images[(project, name)] = im
            return im

    def deploy_pool(self, *, project: str, region: str, name: str, labels: dict[str, str],
                    zones: list[str], machine_type: str = "a3-highgpu-8g",
                    template: str | None = None, older_templates: tuple[str, ...] = (),
                    running: int = 1, stopped: int = 0, target_stopped_size: int | None = None,
                    standby_delay: int = 440, max_surge: int = 3,
                    autoscaler: tuple[int, int] | None = (1, 6), queue_target: float = 4,
                    fallback_machine_types: tuple[str, ...] = ()) -> dict:
        """What `poolctl deploy --cloud gcp` leaves behind (stacks/gcp), settled: `running`
        healthy serving VMs and `stopped` standby VMs. Returns the names it made."""
        with self.lock:
            self.add_region(project, region, zones)
            for old in older_templates:
                self.add_template(project, old, labels=labels, machine_type=machine_type)
            tname = template or f"{name}-20260105090000000000000001"
            t = self.add_template(project, tname, labels=labels, machine_type=machine_type,
                                  description=f"poolctl {name}")
            rl = f"{API}/projects/{project}/regions/{region}"
            mig = {
                "kind": "compute#instanceGroupManager", "id": self._id(), "name": name,
                "description": f"poolctl pool {name}",
                "creationTimestamp": _ts(self._now()), "region": rl,
                "distributionPolicy": {
                    "zones": [{"zone": f"{API}/projects/{project}/zones/{z}"} for z in zones],
                    "targetShape": "BALANCED",
                },
                # The stack points the version at `self_link_unique`.
                "instanceTemplate": f"{t['selfLink']}?uniqueId={t['id']}",
                "versions": [{"name": "primary",
                              "instanceTemplate": f"{t['selfLink']}?uniqueId={t['id']}"}],
                "instanceGroup": f"{rl}/instanceGroups/{name}",
                "baseInstanceName": name, "fingerprint": "hmT1G2lVyNw=",
                "targetSize": running,
                "targetStoppedSize": stopped if target_stopped_size is None
                else target_stopped_size,
                "targetSuspendedSize": 0,
                "standbyPolicy": {"initialDelaySec": standby_delay, "mode": "SCALE_OUT_POOL"},
                "namedPorts": [{"name": "http", "port": 8000}],
                "autoHealingPolicies": [{"healthCheck": f"{rl}/healthChecks/{name}-heal",
                                         "initialDelaySec": standby_delay}],
                "updatePolicy": {
                    "type": "PROACTIVE", "instanceRedistributionType": "NONE",
                    "minimalAction": "REPLACE", "mostDisruptiveAllowedAction": "REPLACE",
                    "replacementMethod": "SUBSTITUTE",
                    "maxSurge": {"fixed": max_surge, "calculated": max_surge},
                    "maxUnavailable": {"fixed": 0, "calculated": 0},
                },
                "instanceLifecyclePolicy": {"defaultActionOnFailure": "REPAIR",
                                            "forceUpdateOnRepair": "YES"},
                "listManagedInstancesResults": "PAGELESS",
                "selfLink": f"{rl}/instanceGroupManagers/{name}",
            }
            if fallback_machine_types:  # instance flexibility, and no standby pool (stacks/gcp)
                mig["instanceFlexibilityPolicy"] = {"instanceSelections": {
                    f"rank-{rank}": {"rank": rank, "machineTypes": [t]} for rank, t in
                    enumerate([machine_type, *fallback_machine_types])}}
                for k in ("standbyPolicy", "targetStoppedSize", "targetSuspendedSize"):
                    mig.pop(k)
            key = (project, region, name)
            self.migs[key] = mig
            self.managed[key] = []
            for _ in range(running):
                self._new_instance(key, "RUNNING", settled=True)
            for _ in range(stopped):
                self._new_instance(key, "STOPPED", settled=True)
            out = {"mig": name, "template": tname, "autoscaler": None}
            if autoscaler is not None:
                lo, hi = autoscaler
                self.autoscalers[key[:2] + (name,)] = {
                    "kind": "compute#autoscaler", "id": self._id(), "name": name,
                    "creationTimestamp": _ts(self._now()), "region": rl,
                    "target": mig["selfLink"], "status": "ACTIVE", "recommendedSize": running,
                    "selfLink": f"{rl}/autoscalers/{name}",
                    "autoscalingPolicy": {
                        "minNumReplicas": lo, "maxNumReplicas": hi,
                        "coolDownPeriodSec": standby_delay, "mode": "ON",
                        "customMetricUtilizations": [{
                            "metric": naming.GCP_METRIC_TYPE,
                            "filter": 'resource.type = "gce_instance"',
                            "utilizationTarget": float(queue_target),
                            "utilizationTargetType": "GAUGE",
                        }],
                        "scaleInControl": {"maxScaledInReplicas": {"fixed": 1, "calculated": 1},
                                           "timeWindowSec": 900},
                    },
                }
                out["autoscaler"] = name
            return out

    # ------------------------------------------------------------------ instances

    @staticmethod
    def _tpl(link: str) -> str:
        return link.split("?", 1)[0]

    def _canary(self, key) -> tuple[str | None, int, str]:
        """(canary template or None, its VM count, the template of the version without a
        target size): what the MIG's versions ask for."""
        mig = self.migs[key]
        versions = mig["versions"]
        rest = next(v for v in versions if not v.get("targetSize"))
        sized = next((v for v in versions if v.get("targetSize")), None)
        if sized is None:
            return None, 0, self._tpl(rest["instanceTemplate"])
        return self._tpl(sized["instanceTemplate"]), self._calculated(
            sized["targetSize"], mig["targetSize"]), self._tpl(rest["instanceTemplate"])

    @staticmethod
    def _calculated(ts: dict, group_size: int) -> int:
        if "fixed" in ts:
            return min(int(ts["fixed"]), group_size)
        return -(-int(ts.get("percent", 0)) * group_size // 100)  # rounded up

    def _out_of_place(self, key) -> list[tuple[dict, str]]:
        """(VM, the template it should run) for every live VM not where its version wants
        it, those being recreated first."""
        canary, k, rest = self._canary(key)
        live = [mi for mi in self.managed[key]
                if mi["currentAction"] not in ("DELETING", "ABANDONING")]
        live.sort(key=lambda mi: mi["currentAction"] != "RECREATING")
        out: list[tuple[dict, str]] = []
        if canary is not None:
            on = [mi for mi in live if self._tpl(mi["version"]["instanceTemplate"]) == canary]
            others = [mi for mi in live if mi not in on]
            # Serving VMs take the canary first: the canary is there to take traffic.
            others.sort(key=lambda mi: mi["targetStatus"] != "RUNNING")
            out += [(mi, canary) for mi in others[:max(0, k - len(on))]]
            out += [(mi, rest) for mi in on[k:]]
            chosen = {id(mi) for mi, _ in out}
            live = [mi for mi in others if id(mi) not in chosen]
        out += [(mi, rest) for mi in live
                if self._tpl(mi["version"]["instanceTemplate"]) != rest]
        out.sort(key=lambda pair: pair[0]["currentAction"] != "RECREATING")
        return out

    def _target_template(self, key) -> str:
        """The template a VM created now gets: the canary's while it has fewer VMs than
        asked, else the other version's."""
        canary, k, rest = self._canary(key)
        if canary is not None and sum(
                self._tpl(mi["version"]["instanceTemplate"]) == canary
                for mi in self.managed[key]
                if mi["currentAction"] not in ("DELETING", "ABANDONING")) < k:
            return canary
        return rest

    def _new_instance(self, key, target: str, *, settled: bool = False,
                      template: str | None = None) -> dict:
        project, region, name = key
        mig = self.migs[key]
        zones = [_last(z["zone"]) for z in mig["distributionPolicy"]["zones"]]
        n = next(self._clock)
        iname = f"{mig['baseInstanceName']}-{n:04x}"
        tpl = template or self._target_template(key)
        zone = self._pick_zone(key, zones[n % len(zones)], tpl)
        mi = {
            "instance": f"{API}/projects/{project}/zones/{zone}/instances/{iname}",
            "id": self._id(), "name": iname,
            "instanceStatus": "PROVISIONING", "currentAction": "CREATING",
            "targetStatus": target,
            "version": {"name": "primary", "instanceTemplate": tpl},
            "instanceHealth": [], "lastAttempt": {},
        }
        self.managed[key].append(mi)
        if self._acquire(key, mi, "CREATING") and settled:
            self._finish(key, mi)
        return mi

    def _finish(self, key, mi: dict) -> None:
        heal = self.migs[key]["autoHealingPolicies"][0]["healthCheck"]
        if mi["targetStatus"] == "RUNNING":
            mi.update(instanceStatus="RUNNING", currentAction="NONE",
                      instanceHealth=[{"healthCheck": heal, "detailedHealthState": "HEALTHY"}])
        else:  # GCE reports a stopped VM as TERMINATED.
            mi.update(instanceStatus="TERMINATED", currentAction="NONE", instanceHealth=[])

    # ------------------------------------------------------------------ capacity

    def withdraw_offer(self, zone: str, machine_type: str) -> None:
        """The zone does not offer the machine type: machineTypes.get answers 404 there."""
        with self.lock:
            self.not_offered.add((zone, machine_type))

    def set_capacity(self, zone: str, machine_type: str, n: int | None) -> None:
        """The zone runs at most `n` VMs of the machine type On-Demand (None: no limit).
        VMs held back for capacity try again on `settle()`."""
        with self.lock:
            if n is None:
                self.capacity.pop((zone, machine_type), None)
            else:
                self.capacity[(zone, machine_type)] = int(n)

    def add_reservation(self, project: str, zone: str, name: str, *, machine_type: str,
                        count: int, specific: bool = False,
                        accelerators: list[dict] | None = None,
                        local_ssds: list[dict] | None = None) -> dict:
        """A READY zonal reservation, as `gcloud compute reservations create` leaves it."""
        with self.lock:
            body: dict[str, Any] = {"name": name, "specificReservationRequired": specific,
                    "specificReservation": {"count": str(count), "instanceProperties": {
                        "machineType": machine_type}}}
            props = body["specificReservation"]["instanceProperties"]
            if accelerators:
                props["guestAccelerators"] = accelerators
            if local_ssds:
                props["localSsds"] = local_ssds
            return self._new_reservation(project, zone, body)

    def _new_reservation(self, project: str, zone: str, body: dict) -> dict:
        self.add_project(project)
        r = copy.deepcopy(body)
        r.update(kind="compute#reservation", id=self._id(), zone=f"{API}/projects/{project}/"
                 f"zones/{zone}", creationTimestamp=_ts(self._now()), status="READY",
                 selfLink=f"{API}/projects/{project}/zones/{zone}/reservations/{body['name']}",
                 satisfiesPzs=False)
        r.setdefault("specificReservationRequired", False)
        r["specificReservation"].setdefault("inUseCount", "0")
        self.reservations[(project, zone, body["name"])] = r
        return r

    def render_reservation(self, key) -> dict:
        r = copy.deepcopy(self.reservations[key])
        r["specificReservation"]["inUseCount"] = str(self._in_use(key))
        return r

    @staticmethod
    def _zone_of(mi: dict) -> str:
        return mi["instance"].split("/zones/")[1].split("/")[0]

    @staticmethod
    def _holds(mi: dict) -> bool:
        """A VM that exists and runs (or is about to, or still does) holds capacity; a
        stopped one (TERMINATED) gives it back."""
        return mi.get("instanceStatus") in ("PROVISIONING", "STAGING", "RUNNING", "STOPPING")

    def _props(self, project: str, template_link: str) -> dict:
        t = self.templates.get((project, _last(template_link)))
        return t["properties"] if t else {}

    def _vm_type(self, project: str, mi: dict) -> str:
        """The VM's machine type: the one its MIG's instance flexibility policy chose, else
        its template's."""
        chosen = (mi.get("propertiesFromFlexibilityPolicy") or {}).get("machineType")
        return chosen or self._props(project, mi["version"]["instanceTemplate"]).get(
            "machineType", "")

    def _type_variants(self, key, props: dict) -> list[dict]:
        """The template's properties once per machine type the MIG may create, in rank
        order (instance flexibility: lowest rank first), else the template's alone."""
        sel = (self.migs[key].get("instanceFlexibilityPolicy") or {}).get(
            "instanceSelections") or {}
        ranked = sorted(sel.values(), key=lambda s: int(s.get("rank", 0)))
        types = [t for s in ranked for t in s.get("machineTypes", [])]
        return [{**props, "machineType": t} for t in types] or [props]

    def _in_use(self, rkey) -> int:
        return sum(1 for lst in self.managed.values() for mi in lst
                   if self._holds(mi) and self._consumes.get(mi["name"]) == rkey)

    def _open_use(self, zone: str, machine_type: str) -> int:
        return sum(1 for (p, _r, _m), lst in self.managed.items() for mi in lst
                   if self._holds(mi) and self._zone_of(mi) == zone
                   and self._consumes.get(mi["name"]) not in self.reservations
                   and self._vm_type(p, mi) == machine_type)

    @staticmethod
    def _matches(r: dict, props: dict) -> bool:
        """Whether a reservation's instance properties are the VM's (machine type, GPUs,
        local SSD count and size, as the reservation states them)."""
        want = r["specificReservation"].get("instanceProperties", {})
        if _last(want.get("machineType", "")) != _last(props.get("machineType", "")):
            return False
        gpus = want.get("guestAccelerators")
        if gpus is not None and sorted(
                (_last(g["acceleratorType"]), int(g["acceleratorCount"])) for g in gpus) != \
                sorted((_last(g["acceleratorType"]), int(g["acceleratorCount"]))
                       for g in props.get("guestAccelerators", [])):
            return False
        ssds = want.get("localSsds")
        if ssds is not None:
            scratch = [d for d in props.get("disks", []) if d.get("type") == "SCRATCH"]
            if len(scratch) != len(ssds):
                return False
        return True

    def _reservation_for(self, project: str, zone: str, props: dict
                         ) -> tuple[tuple | None, tuple[str, str] | None]:
        """(reservation to consume, None) or (None, the error when the VM must not run
        On-Demand), per the template's reservationAffinity (default ANY_RESERVATION)."""
        affinity = props.get("reservationAffinity") or {}
        kind = affinity.get("consumeReservationType", "ANY_RESERVATION")
        if kind == "NO_RESERVATION":
            return None, None
        if kind == "SPECIFIC_RESERVATION":
            for value in affinity.get("values", []):
                rkey = (project, zone, _last(value))
                r = self.reservations.get(rkey)
                if r is None:
                    continue
                count = int(r["specificReservation"]["count"])
                if r["status"] == "READY" and self._matches(r, props) and \
                        self._in_use(rkey) < count:
                    return rkey, None
                return None, ("CONDITION_NOT_MET", f"Reservation {_last(value)} does not have "
                              "sufficient capacity for the requested resources.")
            names = ", ".join(_last(v) for v in affinity.get("values", []))
            return None, ("CONDITION_NOT_MET", "Could not find the given reservation with the "
                          f"following name: {names}")
        for rkey, r in sorted(self.reservations.items()):
            if rkey[:2] == (project, zone) and r["status"] == "READY" and \
                    not r.get("specificReservationRequired") and self._matches(r, props) and \
                    self._in_use(rkey) < int(r["specificReservation"]["count"]):
                return rkey, None
        return None, None

    def _fits(self, project: str, zone: str, props: dict) -> bool:
        rkey, error = self._reservation_for(project, zone, props)
        if rkey is not None:
            return True
        if error is not None:
            return False
        cap = self.capacity.get((zone, props.get("machineType", "")))
        return cap is None or self._open_use(zone, props.get("machineType", "")) < cap

    def _pick_zone(self, key, preferred: str, template_link: str,
                   exclude: dict | None = None) -> str:
        """The zone the MIG creates a VM in: per its distribution policy's targetShape
        (compute docs, regional MIG target distribution shape) once capacity is limited or
        reserved anywhere; else `preferred`, the zones in turn, as before."""
        if not self.capacity and not self.reservations:
            return preferred
        project = key[0]
        mig = self.migs[key]
        zones = [_last(z["zone"]) for z in mig["distributionPolicy"]["zones"]]
        shape = mig["distributionPolicy"].get("targetShape", "EVEN")
        props = self._props(project, template_link)
        live = [self._zone_of(mi) for mi in self.managed[key] if mi is not exclude
                and mi["currentAction"] not in ("DELETING", "ABANDONING")]
        count = {z: live.count(z) for z in zones}
        index = {z: i for i, z in enumerate(zones)}
        if shape == "ANY_SINGLE_ZONE" and live:
            return max(zones, key=lambda z: (count[z], -index[z]))
        if shape == "EVEN":  # even counts, capacity or not: a stocked-out zone stays asked
            return min(zones, key=lambda z: (count[z], index[z]))
        fits = {z: any(self._fits(project, z, v) for v in self._type_variants(key, props))
                for z in zones}
        if shape == "BALANCED":
            return min(zones, key=lambda z: (not fits[z], count[z], index[z]))
        reserved = {z: self._reservation_for(project, z, props)[0] is not None for z in zones}
        # ANY and ANY_SINGLE_ZONE: unused reservations first, then where there is room.
        return min(zones, key=lambda z: (not reserved[z], not fits[z], index[z]))

    def _acquire(self, key, mi: dict, action: str) -> bool:
        """Take capacity for a VM being created or started in its zone: a reservation per
        its template's affinity, else the zone's On-Demand capacity. Without room the VM
        stays in its action, the error in its lastAttempt and in the MIG's listErrors."""
        project = key[0]
        zone = self._zone_of(mi)
        props = self._props(project, mi["version"]["instanceTemplate"])
        # A VM being created may take any machine type of the MIG's instance flexibility
        # policy, lowest rank first; a stopped one starts as the type it is.
        variants = (self._type_variants(key, props) if action == "CREATING"
                    else [{**props, "machineType": self._vm_type(project, mi)}])
        first_error: tuple[str, str] | None = None
        for variant in variants:
            rkey, error = self._reservation_for(project, zone, variant)
            if rkey is None and error is None:
                machine_type = variant.get("machineType", "")
                cap = self.capacity.get((zone, machine_type))
                if cap is not None and self._open_use(zone, machine_type) >= cap:
                    error = ("ZONE_RESOURCE_POOL_EXHAUSTED",
                             f"The zone 'projects/{project}/zones/{zone}' does not have "
                             "enough resources available to fulfill the request.  Try a "
                             "different zone, or try again later.")
            if error is None:
                if len(variants) > 1:
                    mi["propertiesFromFlexibilityPolicy"] = {
                        "machineType": variant["machineType"]}
                break
            first_error = first_error or error
        else:
            rkey, error = None, first_error
        if error is not None:
            code, message = error
            if action == "CREATING":
                mi.pop("instanceStatus", None)  # the VM does not exist yet
            mi["lastAttempt"] = {"errors": {"errors": [{"code": code, "message": message}]}}
            self._waiting[mi["name"]] = action
            self.mig_errors.setdefault(key, []).append({
                "error": {"code": code, "message": message},
                "instanceActionDetails": {"action": action, "instance": mi["instance"],
                                          "version": dict(mi["version"])},
                "timestamp": _ts(self._now())})
            return False
        self._waiting.pop(mi["name"], None)
        self._consumes[mi["name"]] = rkey
        mi["lastAttempt"] = {}
        mi["instanceStatus"] = "PROVISIONING" if action == "CREATING" else "STAGING"
        return True

    def _retry(self, key, mi: dict) -> bool:
        """A VM held back for capacity tries again (a VM not yet created may go to another
        zone, as its target shape allows)."""
        action = self._waiting[mi["name"]]
        mig = self.migs[key]
        shape = mig["distributionPolicy"].get("targetShape", "EVEN")
        if action == "CREATING" and shape in ("BALANCED", "ANY"):
            zone = self._pick_zone(key, self._zone_of(mi), mi["version"]["instanceTemplate"],
                                   exclude=mi)
            mi["instance"] = f"{API}/projects/{key[0]}/zones/{zone}/instances/{mi['name']}"
        return self._acquire(key, mi, action)

    def instances(self, project: str, region: str, mig: str) -> list[dict]:
        """The MIG's managed instances, as dicts the test may edit in place."""
        return self.managed[(project, region, mig)]

    def instance(self, name: str) -> dict:
        for lst in self.managed.values():
            for mi in lst:
                if mi["name"] == name:
                    return mi
        raise KeyError(name)

    def set_health(self, name: str, state: str) -> None:
        with self.lock:
            mi = self.instance(name)
            for h in mi["instanceHealth"]:
                h["detailedHealthState"] = state

    def settle(self, project: str | None = None, region: str | None = None,
               mig: str | None = None) -> None:
        """Let every scheduled action finish: VMs created, started, stopped or deleted; a VM
        held back for capacity tries again and finishes only if it finds room."""
        with self.lock:
            for key, lst in self.managed.items():
                if (project, region, mig) != (None, None, None) and key != (project, region, mig):
                    continue
                for mi in list(lst):
                    if mi["currentAction"] in ("DELETING", "ABANDONING"):
                        lst.remove(mi)
                        self._waiting.pop(mi["name"], None)
                    elif mi["currentAction"] not in ("NONE", "RECREATING"):
                        if mi["name"] in self._waiting and not self._retry(key, mi):
                            continue  # still no capacity: it keeps trying
                        self._finish(key, mi)

    def _reconcile(self, key) -> None:
        mig = self.migs[key]
        live = [mi for mi in self.managed[key]
                if mi["currentAction"] not in ("DELETING", "ABANDONING")]
        running = [mi for mi in live if mi["targetStatus"] == "RUNNING"]
        standby = [mi for mi in live if mi["targetStatus"] in ("STOPPED", "SUSPENDED")]
        want_run, want_stop = mig["targetSize"], mig.get("targetStoppedSize", 0)
        while len(running) < want_run:
            if standby and mig.get("standbyPolicy", {}).get("mode") == "SCALE_OUT_POOL":
                mi = standby.pop(0)
                mi.update(targetStatus="RUNNING", currentAction="STARTING")
                if mi.get("instanceStatus") == "TERMINATED":  # a stopped VM: starting is a launch
                    self._acquire(key, mi, "STARTING")
            else:
                mi = self._new_instance(key, "RUNNING")
            running.append(mi)
        while len(running) > want_run:
            running.pop().update(currentAction="DELETING", targetStatus="DELETED")
        while len(standby) < want_stop:
            standby.append(self._new_instance(key, "STOPPED"))
        while len(standby) > want_stop:
            standby.pop().update(currentAction="DELETING", targetStatus="DELETED")
        self._mark_rollout(key)

    # ------------------------------------------------------------------ rollouts

    def _mark_rollout(self, key) -> None:
        surge = self.migs[key]["updatePolicy"]["maxSurge"].get("fixed", 1) or 1
        moving = [mi for mi, _ in self._out_of_place(key)
                  if mi["currentAction"] in ("NONE", "RECREATING")]
        for mi in self.managed[key]:
            if mi["currentAction"] == "RECREATING" and mi not in moving:
                mi["currentAction"] = "NONE"
        for i, mi in enumerate(moving):
            mi["currentAction"] = "RECREATING" if i < surge else "NONE"

    def set_template(self, project: str, region: str, mig: str, template: str) -> None:
        """What a Terraform apply of a new instance template does to the MIG: its one
        version points at the template (self_link_unique), and the PROACTIVE update starts."""
        with self.lock:
            t = self.templates[(project, template)]
            link = f"{t['selfLink']}?uniqueId={t['id']}"
            m = self.migs[(project, region, mig)]
            m["versions"] = [{"name": "primary", "instanceTemplate": link}]
            m["instanceTemplate"] = link
            self._reconcile((project, region, mig))

    def delete_template(self, project: str, name: str) -> None:
        with self.lock:
            del self.templates[(project, name)]

    def step_rollout(self, project: str, region: str, mig: str, n: int,
                     settled: bool = True) -> int:
        """Replace up to `n` VMs not on their version's template (SUBSTITUTE: new names, same
        target state; healthy at once with `settled`, else CREATING until `settle()`).
        Returns how many were replaced."""
        with self.lock:
            key = (project, region, mig)
            lst = self.managed[key]
            moving = self._out_of_place(key)
            for mi, template in moving[:n]:
                lst.remove(mi)
                self._new_instance(key, mi["targetStatus"], settled=settled, template=template)
            self._mark_rollout(key)
            return min(n, len(moving))

    def set_ip(self, name: str, ip: str) -> None:
        with self.lock:
            self.ips[name] = ip

    def _ip(self, name: str) -> str:
        return self.ips.setdefault(name, f"10.128.0.{len(self.ips) + 2}")

    def instance_list(self, project: str) -> list[tuple[str, dict]]:
        """(zone, compute#instance) of every managed VM of the project, as instances.get
        renders them: the labels of the template it runs, its internal IP."""
        out = []
        for (p, _region, _mig), lst in sorted(self.managed.items()):
            if p != project:
                continue
            for mi in lst:
                if "instanceStatus" not in mi:
                    continue  # held back for capacity: the VM does not exist
                zone = mi["instance"].split("/zones/")[1].split("/")[0]
                tpl = self.templates.get((project, _last(mi["version"]["instanceTemplate"])))
                props = tpl["properties"] if tpl else {}
                out.append((zone, {
                    "kind": "compute#instance", "id": mi["id"], "name": mi["name"],
                    "creationTimestamp": _ts(BASE_TIME), "status": mi["instanceStatus"],
                    "zone": f"{API}/projects/{project}/zones/{zone}",
                    "machineType": f"{API}/projects/{project}/zones/{zone}/machineTypes/"
                                   f"{self._vm_type(project, mi) or 'a3-highgpu-8g'}",
                    "labels": dict(props.get("labels", {})),
                    "networkInterfaces": [{
                        "kind": "compute#networkInterface", "name": "nic0",
                        "network": f"{API}/projects/{project}/global/networks/default",
                        "networkIP": self._ip(mi["name"]), "nicType": "GVNIC"}],
                    "selfLink": mi["instance"],
                }))
        return out

    # ------------------------------------------------------------------ OS Login

    def set_os_login_user(self, account: str, username: str, uid: int = 1_234_567_890) -> None:
        """The POSIX account OS Login gives `account` (a user or service account email)."""
        with self.lock:
            self.os_login.setdefault(account, {"keys": {}}).update(username=username, uid=uid)

    def os_login_keys(self, account: str) -> dict[str, dict]:
        return self.os_login.get(account, {}).get("keys", {})

    # ------------------------------------------------------------------ quota preferences

    def grant(self, name: str, value: int | None = None) -> dict:
        """Google's decision on a preference: granted (all, or `value`), reconciling ends,
        and the compute quota limit follows."""
        with self.lock:
            pref = self.preferences[name]
            cfg = pref["quotaConfig"]
            granted = int(cfg["preferredValue"]) if value is None else value
            cfg["grantedValue"] = str(granted)
            cfg["stateDetail"] = "" if granted >= int(cfg["preferredValue"]) else \
                "Request partially granted"
            pref["reconciling"] = False
            pref["updateTime"] = _ts(self._now())
            project = name.split("/")[1]
            dims = pref.get("dimensions", {})
            metric = _metric_of(pref["quotaId"], dims)
            if metric and "region" in dims and (project, dims["region"]) in self.regions:
                quotas = self.regions[(project, dims["region"])]["quotas"]
            elif metric and project in self.projects:
                quotas = self.projects[project]["quotas"]
            else:
                quotas = None
            if quotas is not None and metric:  # a metric found: the branches above
                usage = next((q["usage"] for q in quotas if q["metric"] == metric), 0.0)
                self._set_quota(quotas, metric, granted, usage)
            return pref

    # ------------------------------------------------------------------ faults

    def add_forwarding_rule(self, project: str, region: str, name: str, *, ip: str,
                            port: int, https: bool = False,
                            labels: dict[str, str] | None = None) -> dict:
        """The regional internal forwarding rule the GCP stack puts in front of the pool."""
        with self.lock:
            rl = f"{API}/projects/{project}/regions/{region}"
            proxy = "targetHttpsProxies" if https else "targetHttpProxies"
            r = {"kind": "compute#forwardingRule", "id": self._id(), "name": name,
                 "creationTimestamp": _ts(self._now()), "region": rl, "IPAddress": ip,
                 "IPProtocol": "TCP", "portRange": f"{port}-{port}",
                 "target": f"{rl}/{proxy}/{name}-proxy",
                 "loadBalancingScheme": "INTERNAL_MANAGED", "networkTier": "PREMIUM",
                 "network": f"{API}/projects/{project}/global/networks/default",
                 "labels": dict(labels or {}), "labelFingerprint": "42WmSpB8rSM=",
                 "allowGlobalAccess": False, "selfLink": f"{rl}/forwardingRules/{name}"}
            self.forwarding_rules[(project, region, name)] = r
            return r

    def write_serial(self, instance: str, text: str) -> None:
        """Lines on a VM's first serial port (its console: the boot script's log)."""
        with self.lock:
            self.instance(instance)  # a VM of a MIG, or KeyError
            self.serial[instance] = self.serial.get(instance, "") + text

    def write_log(self, project: str, instance_id: str, text: str, when: datetime,
                  zone: str = "us-central1-a") -> dict:
        """One Cloud Logging entry of a VM (what the guest's logging agent ships)."""
        with self.lock:
            e = {"logName": f"projects/{project}/logs/syslog",
                 "resource": {"type": "gce_instance",
                              "labels": {"project_id": project, "instance_id": instance_id,
                                         "zone": zone}},
                 "timestamp": _ts(when), "receiveTimestamp": _ts(when),
                 "severity": "INFO", "insertId": self._id(), "textPayload": text}
            self.log_entries.append(e)
            return e

    def write_point(self, project: str, instance: str, value: float, end: datetime,
                    metric_type: str = naming.GCP_METRIC_TYPE) -> None:
        """A point of the queue metric on the series of managed VM `instance`, as its boot
        script's publish_queue writes it (timeSeries.create: resource gce_instance labelled
        with the VM's project, numeric id and zone; a GAUGE DOUBLE)."""
        with self.lock:
            mi = self.instance(instance)
            labels = {"project_id": project, "instance_id": mi["id"],
                      "zone": mi["instance"].split("/zones/")[1].split("/")[0]}
            ts = next((t for t in self.time_series if t["metric"]["type"] == metric_type
                       and t["resource"]["labels"] == labels), None)
            if ts is None:
                ts = {"metric": {"type": metric_type, "labels": {}},
                      "resource": {"type": "gce_instance", "labels": labels},
                      "metricKind": "GAUGE", "valueType": "DOUBLE", "points": []}
                self.time_series.append(ts)
            ts["points"].append({"interval": {"startTime": _ts(end), "endTime": _ts(end)},
                                 "value": {"doubleValue": float(value)}})
            ts["points"].sort(key=lambda p: p["interval"]["endTime"], reverse=True)

    def fail_next(self, method: str, path_regex: str, status: int = 503, times: int = 1):
        with self.lock:
            self._failures.append(_Failure(method.upper(), re.compile(path_regex), status, times))

    def fail_next_operation(self, target_regex: str, code: str = "QUOTA_EXCEEDED",
                            message: str = "Quota 'NVIDIA_H100_GPUS' exceeded.") -> None:
        with self.lock:
            self._op_failures.append((re.compile(target_regex), code, message))

    def _take_failure(self, method: str, path: str) -> int | None:
        for f in self._failures:
            if f.method == method and f.pattern.search(path) and f.times > 0:
                f.times -= 1
                return f.status
        return None

    # ------------------------------------------------------------------ operations

    def _operation(self, project: str, region: str | None, op_type: str, target: dict,
                   effect, zone: str | None = None) -> dict:
        """A region operation, a zone one with `zone` (kept under region "zones/ZONE"), or a
        global one with neither."""
        name = f"operation-{next(self._clock):013d}-{self._id()[-8:]}"
        now = _ts(self._now())
        if zone is not None:
            region = f"zones/{zone}"
        where = "global" if region is None else (
            region if region.startswith("zones/") else f"regions/{region}")
        op = {
            "kind": "compute#operation", "id": self._id(), "name": name,
            "operationType": op_type, "targetLink": target["selfLink"],
            "targetId": target["id"], "status": "PENDING", "progress": 0,
            "user": "poolctl-test@example.iam.gserviceaccount.com",
            "insertTime": now,
            "selfLink": f"{API}/projects/{project}/{where}/operations/{name}",
        }
        if zone is not None:
            op["zone"] = f"{API}/projects/{project}/zones/{zone}"
        elif region is not None:
            op["region"] = f"{API}/projects/{project}/regions/{region}"
        for pat, code, message in self._op_failures:
            if pat.search(target["selfLink"]):
                self._op_failures.remove((pat, code, message))
                err = {"errors": [{"code": code, "message": message}]}

                def effect(err=err, op=op):  # noqa: F811 - the failure replaces the change
                    op.update(error=err, httpErrorStatusCode=403,
                              httpErrorMessage="FORBIDDEN")
                break
        self.operations[(project, region, name)] = op
        self._effects[(project, region, name)] = effect
        return op

    def _advance(self, key) -> dict:
        op = self.operations[key]
        if op["status"] == "PENDING":
            op.update(status="RUNNING", startTime=_ts(self._now()), progress=50)
        elif op["status"] == "RUNNING":
            op.update(status="DONE", endTime=_ts(self._now()), progress=100)
            effect = self._effects.pop(key, None)
            if effect:
                effect()
        return op

    # ------------------------------------------------------------------ rendering

    def render_mig(self, key) -> dict:
        mig = copy.deepcopy(self.migs[key])
        counts = dict.fromkeys(ACTIONS, 0)
        for mi in self.managed[key]:
            act = mi["currentAction"]
            counts[_ACTION_KEY.get(act, act.lower())] += 1
        reached = not self._out_of_place(key)
        for v in mig["versions"]:
            if v.get("targetSize"):
                v["targetSize"]["calculated"] = self._calculated(v["targetSize"],
                                                                 mig["targetSize"])
        stable = counts["none"] == len(self.managed[key]) and all(
            (mi.get("instanceStatus") == "RUNNING") == (mi["targetStatus"] == "RUNNING")
            for mi in self.managed[key])
        mig["currentActions"] = counts
        mig["status"] = {"isStable": stable, "versionTarget": {"isReached": reached},
                         "stateful": {"hasStatefulConfig": False,
                                      "perInstanceConfigs": {"allEffective": True}}}
        akey = key
        if akey in self.autoscalers:
            mig["status"]["autoscaler"] = self.autoscalers[akey]["selfLink"]
        return mig

    def render_autoscaler(self, key) -> dict:
        a = copy.deepcopy(self.autoscalers[key])
        a["recommendedSize"] = self.migs[key]["targetSize"] if key in self.migs else 0
        return a


# ---------------------------------------------------------------------------------- HTTP

_C = "/compute/v1/projects/(?P<project>[^/]+)"
_R = _C + "/regions/(?P<region>[^/]+)"
_Z = _C + "/zones/(?P<zone>[^/]+)"
_Q = "/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/quotaPreferences"
ROUTES: list[tuple[str, re.Pattern, str]] = [
    (m, re.compile(f"^{p}$"), h) for m, p, h in [
        ("GET", _R + "/operations/(?P<op>[^/]+)", "op_get"),
        ("POST", _R + "/operations/(?P<op>[^/]+)/wait", "op_wait"),
        ("GET", _R + "/instanceGroupManagers", "mig_list"),
        ("GET", _R + "/instanceGroupManagers/(?P<mig>[^/]+)", "mig_get"),
        ("PATCH", _R + "/instanceGroupManagers/(?P<mig>[^/]+)", "mig_patch"),
        ("POST", _R + "/instanceGroupManagers/(?P<mig>[^/]+)/listManagedInstances", "mig_mis"),
        ("POST", _R + "/instanceGroupManagers/(?P<mig>[^/]+)/resize", "mig_resize"),
        ("GET", _R + "/instanceGroupManagers/(?P<mig>[^/]+)/listErrors", "mig_errors"),
        ("GET", _Z + "/reservations", "res_list"),
        ("POST", _Z + "/reservations", "res_insert"),
        ("GET", _Z + "/reservations/(?P<name>[^/]+)", "res_get"),
        ("DELETE", _Z + "/reservations/(?P<name>[^/]+)", "res_delete"),
        ("GET", _C + "/aggregated/reservations", "res_aggregated"),
        ("GET", _Z + "/machineTypes/(?P<name>[^/]+)", "mt_get"),
        ("POST", _R + "/advice/calendarMode", "advice_calendar"),
        ("POST", _Z + "/futureReservations", "fr_insert"),
        ("GET", _Z + "/futureReservations/(?P<name>[^/]+)", "fr_get"),
        ("GET", _Z + "/operations/(?P<op>[^/]+)", "zop_get"),
        ("POST", _Z + "/operations/(?P<op>[^/]+)/wait", "zop_get"),
        ("GET", _R + "/autoscalers", "as_list"),
        ("GET", _R + "/autoscalers/(?P<name>[^/]+)", "as_get"),
        ("PATCH", _R + "/autoscalers", "as_patch"),
        ("PUT", _R + "/autoscalers", "as_update"),
        ("GET", _R, "region_get"),
        ("GET", _C + "/global/instanceTemplates", "tpl_list"),
        ("GET", _C + "/global/instanceTemplates/(?P<name>[^/]+)", "tpl_get"),
        ("DELETE", _C + "/global/instanceTemplates/(?P<name>[^/]+)", "tpl_delete"),
        ("GET", _C + "/global/images", "img_list"),
        ("GET", _C + "/global/images/(?P<name>[^/]+)", "img_get"),
        ("DELETE", _C + "/global/images/(?P<name>[^/]+)", "img_delete"),
        ("GET", _C + "/global/operations/(?P<op>[^/]+)", "gop_get"),
        ("POST", _C + "/global/operations/(?P<op>[^/]+)/wait", "gop_get"),
        ("GET", _C, "project_get"),
        ("GET", _C + "/aggregated/instances", "inst_aggregated"),
        ("GET", _C + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/serialPort",
         "inst_serial"),
        ("POST", "/v1/users/(?P<user>[^/:]+):importSshPublicKey", "oslogin_import"),
        ("DELETE", "/v1/users/(?P<user>[^/:]+)/sshPublicKeys/(?P<fp>[^/]+)", "oslogin_delete"),
        ("GET", "/_poolctl/instance-connect", "node_keys"),
        ("GET", "/v3/projects/(?P<project>[^/]+)/timeSeries", "ts_list"),
        ("POST", "/v3/projects/(?P<project>[^/]+)/timeSeries", "ts_create"),
        ("GET", _R + "/forwardingRules", "fr_list"),
        ("POST", "/v2/entries:list", "log_list"),
        ("GET", _Q, "qp_list"),
        ("POST", _Q, "qp_create"),
        ("GET", _Q + "/(?P<id>[^/]+)", "qp_get"),
        ("PATCH", _Q + "/(?P<id>[^/]+)", "qp_patch"),
    ]
]


# OS Login v1 REST reference (oslogin.googleapis.com): the fields of each message this fake
# sends or reads; OsLogin's shapes are checked against them, unknown fields refused.
OSLOGIN_FIELDS: dict[str, set[str]] = {
    "ImportSshPublicKeyResponse": {"loginProfile", "details"},
    "LoginProfile": {"name", "posixAccounts", "sshPublicKeys"},
    "PosixAccount": {"primary", "username", "uid", "gid", "homeDirectory", "shell", "gecos",
                     "systemId", "accountId", "operatingSystemType", "name"},
    "SshPublicKey": {"key", "expirationTimeUsec", "fingerprint", "name"},
    "Empty": set(),
}


def _check_oslogin(data: dict, kind: str) -> None:
    unknown = set(data) - OSLOGIN_FIELDS[kind]
    if unknown:
        raise ValueError(f"{kind} has no field {sorted(unknown)}")
    if kind == "ImportSshPublicKeyResponse" and "loginProfile" in data:
        _check_oslogin(data["loginProfile"], "LoginProfile")
    if kind == "LoginProfile":
        for a in data.get("posixAccounts", []):
            _check_oslogin(a, "PosixAccount")
        for k in data.get("sshPublicKeys", {}).values():
            _check_oslogin(k, "SshPublicKey")


def _types():
    from google.cloud import cloudquotas_v1 as q
    from google.cloud import compute_v1 as c

    return c, q


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGce
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the tests read fake.requests instead
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else {}
        with fake.lock:
            fake.requests.append({"method": method, "path": url.path, "query": query,
                                  "body": body})
            status = fake._take_failure(method, url.path)
        if status is not None:
            reason = "rateLimitExceeded" if status == 429 else "backendError"
            err = HttpError(status, "injected failure", reason,
                            "RESOURCE_EXHAUSTED" if status == 429 else "UNAVAILABLE")
            return self._send(status, err.body())
        for m, pat, name in ROUTES:
            match = pat.match(url.path)
            if m == method and match:
                try:
                    with fake.lock:
                        out, kind = getattr(self, name)(query=query, body=body,
                                                        **match.groupdict())
                    self._check(out, kind)
                except HttpError as e:
                    return self._send(e.code, e.body())
                except Exception as e:  # a bug in the fake or a shape mismatch: say so
                    fake.errors.append(f"{method} {url.path}: {type(e).__name__}: {e}")
                    return self._send(500, HttpError(500, f"fake: {e}", "backendError",
                                                     "INTERNAL").body())
                return self._send(200, out)
        self._send(404, _not_found(url.path).body())

    def _check(self, out: dict, kind: str) -> None:
        """Refuse a response whose fields the real message does not have."""
        if not self.fake.strict:
            return
        from google.protobuf import json_format

        if kind in OSLOGIN_FIELDS:
            return _check_oslogin(out, kind)
        if kind == "NodeKeys":
            return
        if kind == "ListLogEntriesResponse":
            return _check_log_entries(out)
        if kind == "ListTimeSeriesResponse":
            return _check_time_series(out)
        c, q = _types()
        msg = getattr(c, kind, None) or getattr(q, kind)
        json_format.Parse(json.dumps(out), msg.pb()(), ignore_unknown_fields=False)

    def _check_body(self, body: dict, kind: str) -> None:
        if self.fake.strict:
            try:
                self._check(body, kind)
            except Exception as e:
                raise HttpError(400, f"Invalid JSON payload received. {e}") from None

    def _send(self, code: int, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    # -- paging

    def _page(self, items: list, query: dict, field: str = "items",
              size_param: str = "maxResults") -> dict:
        size = int(query.get(size_param) or self.fake.page_size)
        start = int(query.get("pageToken") or 0)
        out: dict[str, Any] = {field: items[start:start + size]}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    # -- compute

    def region_get(self, *, project, region, **_):
        r = self.fake.regions.get((project, region))
        if r is None:
            raise _not_found(f"projects/{project}/regions/{region}")
        return r, "Region"

    def project_get(self, *, project, **_):
        p = self.fake.projects.get(project)
        if p is None:
            raise _not_found(f"projects/{project}")
        return p, "Project"

    def tpl_list(self, *, project, query, **_):
        if query.get("filter"):
            raise HttpError(400, "fake: filters are not implemented")
        items = [t for (p, _n), t in sorted(self.fake.templates.items()) if p == project]
        out = self._page(items, query)
        out.update(kind="compute#instanceTemplateList", id=f"projects/{project}/global/"
                   "instanceTemplates", selfLink=f"{API}/projects/{project}/global/"
                   "instanceTemplates")
        return out, "InstanceTemplateList"

    def tpl_get(self, *, project, name, **_):
        t = self.fake.templates.get((project, name))
        if t is None:
            raise _not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return t, "InstanceTemplate"

    def tpl_delete(self, *, project, name, **_):
        fake = self.fake
        t = fake.templates.get((project, name))
        if t is None:
            raise _not_found(f"projects/{project}/global/instanceTemplates/{name}")
        for (p, region, mig), m in fake.migs.items():
            used = [m.get("instanceTemplate", "")] + [
                v.get("instanceTemplate", "") for v in m.get("versions", [])]
            if p == project and name in {_last(u) for u in used}:
                raise HttpError(
                    400, f"The instance_template resource 'projects/{project}/global/"
                         f"instanceTemplates/{name}' is already being used by 'projects/"
                         f"{project}/regions/{region}/instanceGroupManagers/{mig}'",
                    "resourceInUseByAnotherResource", "FAILED_PRECONDITION")

        def effect():
            fake.templates.pop((project, name), None)

        return fake._operation(project, None, "delete", t, effect), "Operation"

    # -- images (global)

    def img_list(self, *, project, query, **_):
        if project not in self.fake.projects:
            raise _not_found(f"projects/{project}")
        want = _parse_filter(query.get("filter", ""))
        if any(not k.startswith("labels.") for k, _v in want):
            raise HttpError(400, "fake: images.list filters on labels only")
        items = [im for (p, _n), im in sorted(self.fake.images.items()) if p == project
                 and all(im["labels"].get(k[len("labels."):]) == v for k, v in want)]
        out = self._page(items, query)
        out.update(kind="compute#imageList", id=f"projects/{project}/global/images",
                   selfLink=f"{API}/projects/{project}/global/images")
        return out, "ImageList"

    def img_get(self, *, project, name, **_):
        im = self.fake.images.get((project, name))
        if im is None:
            raise _not_found(f"projects/{project}/global/images/{name}")
        return im, "Image"

    def img_delete(self, *, project, name, **_):
        """As GCE: an image that instance templates name can still be deleted (VMs made from
        them later fail); callers must check what uses it."""
        fake = self.fake
        im = fake.images.get((project, name))
        if im is None:
            raise _not_found(f"projects/{project}/global/images/{name}")

        def effect():
            fake.images.pop((project, name), None)

        return fake._operation(project, None, "delete", im, effect), "Operation"

    def gop_get(self, *, project, op, **_):
        key = (project, None, op)
        if key not in self.fake.operations:
            raise _not_found(f"projects/{project}/global/operations/{op}")
        return self.fake._advance(key), "Operation"

    def _mig_key(self, project, region, mig):
        key = (project, region, mig)
        if key not in self.fake.migs:
            raise _not_found(f"projects/{project}/regions/{region}/instanceGroupManagers/{mig}")
        return key

    def _region(self, project, region) -> None:
        if (project, region) not in self.fake.regions:
            raise _not_found(f"projects/{project}/regions/{region}")

    def mig_list(self, *, project, region, query, **_):
        self._region(project, region)
        if query.get("filter"):
            raise HttpError(400, "fake: filters are not implemented")
        items = [self.fake.render_mig(k) for k in sorted(self.fake.migs)
                 if k[:2] == (project, region)]
        out = self._page(items, query)
        out.update(kind="compute#regionInstanceGroupManagerList",
                   id=f"projects/{project}/regions/{region}/instanceGroupManagers",
                   selfLink=f"{API}/projects/{project}/regions/{region}/instanceGroupManagers")
        return out, "RegionInstanceGroupManagerList"

    def mig_get(self, *, project, region, mig, **_):
        return self.fake.render_mig(self._mig_key(project, region, mig)), "InstanceGroupManager"

    def mig_mis(self, *, project, region, mig, query, **_):
        key = self._mig_key(project, region, mig)
        items = copy.deepcopy(self.fake.managed[key])
        if self.fake.migs[key].get("listManagedInstancesResults") == "PAGINATED":
            out = self._page(items, query, "managedInstances")
        else:  # PAGELESS (the default, and what the stack leaves): one page, no token
            out = {"managedInstances": items}
        return out, "RegionInstanceGroupManagersListInstancesResponse"

    def mig_patch(self, *, project, region, mig, body, **_):
        key = self._mig_key(project, region, mig)
        self._check_body(body, "InstanceGroupManager")
        for ro in ("status", "currentActions", "selfLink", "id", "name", "region"):
            if ro in body and ro != "name":
                raise HttpError(400, f"Invalid value for field 'resource.{ro}': output only")
        if "name" in body and body["name"] != mig:
            raise HttpError(400, "Invalid value for field 'resource.name'")
        versions = body.get("versions", [])
        for v in versions:
            tname = _last(v.get("instanceTemplate", ""))
            if (project, tname) not in self.fake.templates:
                raise _not_found(f"projects/{project}/global/instanceTemplates/{tname}")
            pct = (v.get("targetSize") or {}).get("percent")
            if pct is not None and not 0 <= pct <= 100:
                raise HttpError(400, "Invalid value for field 'resource.versions[].targetSize"
                                     f".percent': '{pct}'. Must be between 0 and 100.")
        if versions and (len(versions) > 2
                         or sum(not v.get("targetSize") for v in versions) != 1
                         or len({v.get("name") for v in versions}) != len(versions)
                         or len({_last(v.get("instanceTemplate", "")) for v in versions})
                         != len(versions)):
            raise HttpError(400, "Invalid value for field 'resource.versions': at most two "
                                 "versions with distinct names and templates, exactly one "
                                 "without a targetSize")
        fake = self.fake

        def effect():
            m = fake.migs[key]
            _merge(m, body)
            if "versions" in body and "instanceTemplate" not in body:
                m["instanceTemplate"] = body["versions"][-1]["instanceTemplate"]
            fake._reconcile(key)

        return fake._operation(project, region, "patch", fake.migs[key], effect), "Operation"

    def mig_resize(self, *, project, region, mig, query, **_):
        key = self._mig_key(project, region, mig)
        if "size" not in query or int(query["size"]) < 0:
            raise HttpError(400, "Required field 'size' not specified")
        size = int(query["size"])
        fake = self.fake

        def effect():
            fake.migs[key]["targetSize"] = size
            fake._reconcile(key)

        return fake._operation(project, region, "compute.instanceGroupManagers.resize",
                               fake.migs[key], effect), "Operation"

    def mig_errors(self, *, project, region, mig, query, **_):
        """regionInstanceGroupManagers.listErrors: newest first (filter and orderBy are not
        supported, as the reference says)."""
        key = self._mig_key(project, region, mig)
        items = list(reversed(self.fake.mig_errors.get(key, [])))
        return self._page(items, query), "RegionInstanceGroupManagersListErrorsResponse"

    # -- reservations (zonal)

    def _zone(self, project, zone) -> None:
        link = f"{API}/projects/{project}/zones/{zone}"
        if not any(link in r["zones"] for (p, _r), r in self.fake.regions.items()
                   if p == project):
            raise _not_found(f"projects/{project}/zones/{zone}")

    def res_list(self, *, project, zone, query, **_):
        self._zone(project, zone)
        if query.get("filter"):
            raise HttpError(400, "fake: filters are not implemented")
        items = [self.fake.render_reservation(k) for k in sorted(self.fake.reservations)
                 if k[:2] == (project, zone)]
        out = self._page(items, query)
        out.update(kind="compute#reservationList",
                   id=f"projects/{project}/zones/{zone}/reservations",
                   selfLink=f"{API}/projects/{project}/zones/{zone}/reservations")
        return out, "ReservationList"

    def res_aggregated(self, *, project, query, **_):
        if project not in self.fake.projects:
            raise _not_found(f"projects/{project}")
        by_zone: dict[str, list] = {}
        for k in sorted(self.fake.reservations):
            if k[0] == project:
                by_zone.setdefault(f"zones/{k[1]}", []).append(
                    self.fake.render_reservation(k))
        return {"kind": "compute#reservationAggregatedList",
                "id": f"projects/{project}/aggregated/reservations",
                "items": {z: {"reservations": rs} for z, rs in by_zone.items()},
                "selfLink": f"{API}/projects/{project}/aggregated/reservations"}, \
            "ReservationAggregatedList"

    def advice_calendar(self, *, project, region, body, **_):
        """Calendar-mode advice: per spec, the first allowed zone of the region whose
        On-Demand limit (`set_capacity`) leaves room for the VMs, from the earliest start
        asked for, for the shortest duration asked for."""
        self._region(project, region)
        self._check_body(body, "CalendarModeAdviceRequest")
        zones = [_last(z) for z in self.fake.regions[(project, region)]["zones"]]
        out = {}
        for key, spec in body.get("futureResourcesSpecs", {}).items():
            sku = spec["targetResources"]["specificSkuResources"]
            count, machine = int(sku["instanceCount"]), sku["machineType"]
            allowed = {_last(k) for k, v in spec.get("locationPolicy", {}).get(
                "locations", {}).items() if v.get("preference") != "DENY"} or set(zones)
            room = [z for z in zones if z in allowed and (z, machine) not in self.fake.not_offered
                    and self.fake.capacity.get((z, machine), count) >= count]
            if not room:
                continue
            span = spec["timeRangeSpec"]
            start = datetime.fromisoformat(span["startTimeNotEarlierThan"].replace("Z", "+00:00"))
            end = start + timedelta(seconds=int(span["minDuration"].rstrip("s")))
            out[key] = {"recommendationId": f"rec-{self.fake._id()[-8:]}",
                        "recommendationType": "FUTURE_RESERVATION",
                        "location": f"zones/{room[0]}",
                        "startTime": _ts(start), "endTime": _ts(end)}
        return {"recommendations": [{"recommendationsPerSpec": out}] if out else []}, \
            "CalendarModeAdviceResponse"

    def fr_insert(self, *, project, zone, body, **_):
        self._zone(project, zone)
        self._check_body(body, "FutureReservation")
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise HttpError(400, f"Invalid value for field 'resource.name': '{name}'")
        key = (project, zone, name)
        if key in self.fake.future_reservations:
            raise HttpError(409, f"The resource 'projects/{project}/zones/{zone}/"
                                 f"futureReservations/{name}' already exists", "alreadyExists",
                            "ALREADY_EXISTS")
        fake = self.fake
        link = f"{API}/projects/{project}/zones/{zone}/futureReservations/{name}"

        def effect():
            fake.future_reservations[key] = {
                **body, "kind": "compute#futureReservation", "id": fake._id(),
                "selfLink": link, "zone": f"{API}/projects/{project}/zones/{zone}",
                "creationTimestamp": _ts(fake._now()),
                "status": {"procurementStatus": fake.future_reservation_state}}

        return fake._operation(project, None, "insert", {"selfLink": link, "id": fake._id()},
                               effect, zone=zone), "Operation"

    def fr_get(self, *, project, zone, name, **_):
        key = (project, zone, name)
        if key not in self.fake.future_reservations:
            raise _not_found(f"projects/{project}/zones/{zone}/futureReservations/{name}")
        return self.fake.future_reservations[key], "FutureReservation"

    def mt_get(self, *, project, zone, name, **_):
        self._zone(project, zone)
        what = f"projects/{project}/zones/{zone}/machineTypes/{name}"
        if (zone, name) in self.fake.not_offered:
            raise _not_found(what)
        return {"kind": "compute#machineType", "name": name, "zone": zone,
                "selfLink": f"{API}/{what}"}, "MachineType"

    def res_get(self, *, project, zone, name, **_):
        key = (project, zone, name)
        if key not in self.fake.reservations:
            raise _not_found(f"projects/{project}/zones/{zone}/reservations/{name}")
        return self.fake.render_reservation(key), "Reservation"

    def res_insert(self, *, project, zone, body, **_):
        self._zone(project, zone)
        self._check_body(body, "Reservation")
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise HttpError(400, f"Invalid value for field 'resource.name': '{name}'. Must be a "
                                 "match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        sku = body.get("specificReservation") or {}
        if int(sku.get("count") or 0) <= 0:
            raise HttpError(400, "Invalid value for field 'resource.specificReservation.count'"
                                 f": '{sku.get('count')}'. Must be greater than 0.")
        if not (sku.get("instanceProperties") or {}).get("machineType"):
            raise HttpError(400, "Required field 'resource.specificReservation."
                                 "instanceProperties.machineType' not specified")
        if (project, zone, name) in self.fake.reservations:
            raise HttpError(409, f"The resource 'projects/{project}/zones/{zone}/reservations/"
                                 f"{name}' already exists", "alreadyExists", "ALREADY_EXISTS")
        fake = self.fake
        target = {"selfLink": f"{API}/projects/{project}/zones/{zone}/reservations/{name}",
                  "id": fake._id()}

        def effect():
            r = fake._new_reservation(project, zone, body)
            r["id"] = target["id"]

        return fake._operation(project, None, "insert", target, effect, zone=zone), "Operation"

    def res_delete(self, *, project, zone, name, **_):
        key = (project, zone, name)
        if key not in self.fake.reservations:
            raise _not_found(f"projects/{project}/zones/{zone}/reservations/{name}")
        fake = self.fake

        def effect():  # VMs consuming it keep running, On-Demand from now on
            fake.reservations.pop(key, None)

        return fake._operation(project, None, "delete", fake.reservations[key], effect,
                               zone=zone), "Operation"

    def zop_get(self, *, project, zone, op, **_):
        key = (project, f"zones/{zone}", op)
        if key not in self.fake.operations:
            raise _not_found(f"projects/{project}/zones/{zone}/operations/{op}")
        return self.fake._advance(key), "Operation"

    def as_list(self, *, project, region, query, **_):
        self._region(project, region)
        items = [self.fake.render_autoscaler(k) for k in sorted(self.fake.autoscalers)
                 if k[:2] == (project, region)]
        out = self._page(items, query)
        out.update(kind="compute#regionAutoscalerList",
                   id=f"projects/{project}/regions/{region}/autoscalers",
                   selfLink=f"{API}/projects/{project}/regions/{region}/autoscalers")
        return out, "RegionAutoscalerList"

    def as_get(self, *, project, region, name, **_):
        key = (project, region, name)
        if key not in self.fake.autoscalers:
            raise _not_found(f"projects/{project}/regions/{region}/autoscalers/{name}")
        return self.fake.render_autoscaler(key), "Autoscaler"

    def _as_write(self, project, region, query, body) -> tuple[tuple, dict]:
        """The autoscaler a patch/update names (404 if none), the body checked; its key
        and a copy of it to change."""
        name = query.get("autoscaler") or body.get("name")
        key = (project, region, name or "")
        if key not in self.fake.autoscalers:
            raise _not_found(f"projects/{project}/regions/{region}/autoscalers/{name}")
        self._check_body(body, "Autoscaler")
        return key, copy.deepcopy(self.fake.autoscalers[key])

    def as_patch(self, *, project, region, query, body, **_):
        key, merged = self._as_write(project, region, query, body)
        _merge(merged, body)
        pol = merged["autoscalingPolicy"]
        lo, hi = pol.get("minNumReplicas", 0), pol.get("maxNumReplicas", 0)
        if lo > hi:
            raise HttpError(400, "Invalid value for field 'resource.autoscalingPolicy."
                                 f"minNumReplicas': '{lo}'. Must be less than or equal to "
                                 f"maxNumReplicas ({hi}).")
        return self._as_apply(project, region, key, merged, "patch"), "Operation"

    def _as_apply(self, project, region, key, merged, verb) -> dict:
        """The operation that writes `merged` and sizes its MIG within the new bounds."""
        fake = self.fake
        pol = merged["autoscalingPolicy"]
        lo, hi = pol.get("minNumReplicas", 0), pol.get("maxNumReplicas", 0)
        mkey = (project, region, _last(merged["target"]))

        def effect():
            fake.autoscalers[key] = merged
            if mkey in fake.migs:
                m = fake.migs[mkey]
                m["targetSize"] = min(max(m["targetSize"], lo), hi)
                fake._reconcile(mkey)

        return fake._operation(project, region, f"compute.autoscalers.{verb}",
                               fake.autoscalers[key], effect)

    def as_update(self, *, project, region, query, body, **_):
        """regionAutoscalers.update: the whole resource replaced (output-only fields kept);
        scaling schedules checked as the API documents them."""
        key, merged = self._as_write(project, region, query, body)
        merged["autoscalingPolicy"] = copy.deepcopy(body.get("autoscalingPolicy") or {})
        schedules = merged["autoscalingPolicy"].get("scalingSchedules") or {}
        if len(schedules) > 128:
            raise HttpError(400, "Invalid value for field 'resource.autoscalingPolicy."
                                 "scalingSchedules': at most 128 scaling schedules")
        for sname, sch in schedules.items():
            for required in ("minRequiredReplicas", "schedule", "durationSec"):
                if required not in sch:
                    raise HttpError(400, f"Invalid value for field 'resource.autoscalingPolicy"
                                         f".scalingSchedules[{sname}].{required}': required")
            if int(sch["durationSec"]) < 300:
                raise HttpError(400, f"Invalid value for field 'resource.autoscalingPolicy."
                                     f"scalingSchedules[{sname}].durationSec': "
                                     f"'{sch['durationSec']}'. Must be at least 300.")
        return self._as_apply(project, region, key, merged, "update"), "Operation"

    def op_get(self, *, project, region, op, **_):
        key = (project, region, op)
        if key not in self.fake.operations:
            raise _not_found(f"projects/{project}/regions/{region}/operations/{op}")
        return self.fake._advance(key), "Operation"

    def op_wait(self, **kw):
        return self.op_get(**kw)

    # -- Cloud Quotas

    def _qp_parent(self, project, location):
        if location != "global":
            raise HttpError(400, "quota preferences live in location 'global'")
        return f"projects/{project}/locations/{location}"

    def qp_list(self, *, project, location, query, **_):
        parent = self._qp_parent(project, location)
        items = [p for n, p in sorted(self.fake.preferences.items())
                 if n.startswith(parent + "/")]
        out = self._page(items, query, "quotaPreferences", "pageSize")
        return out, "ListQuotaPreferencesResponse"

    def qp_get(self, *, project, location, id, **_):
        name = f"{self._qp_parent(project, location)}/quotaPreferences/{id}"
        if name not in self.fake.preferences:
            raise _not_found(name)
        return self.fake.preferences[name], "QuotaPreference"

    def _validate_pref(self, pref: dict, project: str) -> None:
        self._check_body(pref, "QuotaPreference")
        for key in ("service", "quotaId"):
            if not pref.get(key):
                raise HttpError(400, f"quota_preference.{key} is required")
        if not str(pref.get("quotaConfig", {}).get("preferredValue", "")).lstrip("-").isdigit():
            raise HttpError(400, "quota_preference.quota_config.preferred_value is required")
        dims = pref.get("dimensions", {})
        if pref["quotaId"].endswith("-per-project-region") and "region" not in dims:
            raise HttpError(400, f"quota {pref['quotaId']} needs the dimension 'region'")
        metric = _metric_of(pref["quotaId"], dims)
        current = 0.0
        if metric:
            src = (self.fake.regions.get((project, dims.get("region", "")), {}) or
                   self.fake.projects.get(project, {}))
            current = next((q["limit"] for q in src.get("quotas", [])
                            if q["metric"] == metric), 0.0)
        if int(pref["quotaConfig"]["preferredValue"]) > current and not pref.get("contactEmail"):
            raise HttpError(400, "contact_email is required when requesting a quota increase")
        pref.setdefault("quotaConfig", {})["grantedValue"] = str(int(current))

    def qp_create(self, *, project, location, query, body, **_):
        parent = self._qp_parent(project, location)
        pid = query.get("quotaPreferenceId") or f"auto-{self.fake._id()[-10:]}"
        name = f"{parent}/quotaPreferences/{pid}"
        if name in self.fake.preferences:
            raise HttpError(409, f"QuotaPreference {name} already exists", "alreadyExists",
                            "ALREADY_EXISTS")
        pref = copy.deepcopy(body)
        self._validate_pref(pref, project)
        now = _ts(self.fake._now())
        pref.pop("contactEmail", None)  # input only: never echoed back
        pref.update(name=name, createTime=now, updateTime=now, reconciling=True,
                    etag=f"etag-{self.fake._id()[-6:]}")
        pref["quotaConfig"]["traceId"] = f"trace-{self.fake._id()[-8:]}"
        pref["quotaConfig"]["requestOrigin"] = "ORIGIN_UNSPECIFIED"
        self.fake.preferences[name] = pref
        return pref, "QuotaPreference"

    def qp_patch(self, *, project, location, id, query, body, **_):
        name = f"{self._qp_parent(project, location)}/quotaPreferences/{id}"
        if name not in self.fake.preferences:
            if query.get("allowMissing") == "true":
                return self.qp_create(project=project, location=location,
                                      query={"quotaPreferenceId": id}, body=body)
            raise _not_found(name)
        mask = [m for m in query.get("updateMask", "").split(",") if m]
        pref = copy.deepcopy(self.fake.preferences[name])
        merged = copy.deepcopy(pref)
        if mask:
            for path in mask:
                parts = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), path).split(".")
                src, dst = body, merged
                for p in parts[:-1]:
                    src, dst = src.get(p, {}), dst.setdefault(p, {})
                if parts[-1] in src:
                    dst[parts[-1]] = src[parts[-1]]
        else:
            _merge(merged, body)
        merged["contactEmail"] = body.get("contactEmail", "")
        self._validate_pref(merged, project)
        merged.pop("contactEmail", None)
        merged.update(reconciling=True, updateTime=_ts(self.fake._now()))
        self.fake.preferences[name] = merged
        return merged, "QuotaPreference"

    # -- instances.aggregatedList

    def inst_serial(self, *, project, zone, name, query, **_):
        """instances.getSerialPortOutput: the port's whole text (GCE keeps the newest 1 MB),
        `start` and `next` as byte offsets."""
        if project not in self.fake.projects:
            raise _not_found(f"projects/{project}")
        try:
            mi = self.fake.instance(name)
        except KeyError:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}") from None
        if f"/zones/{zone}/" not in mi["instance"] or query.get("port", "1") != "1":
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        text = self.fake.serial.get(name, "")
        return {"kind": "compute#serialPortOutput", "contents": text, "start": "0",
                "next": str(len(text.encode())),
                "selfLink": f"{API}/projects/{project}/zones/{zone}/instances/{name}/"
                            "serialPort"}, "SerialPortOutput"

    def inst_aggregated(self, *, project, query, **_):
        if project not in self.fake.projects:
            raise _not_found(f"projects/{project}")
        want = _parse_filter(query.get("filter", ""))
        hits = [(z, i) for z, i in self.fake.instance_list(project) if all(
            (i["labels"].get(k[len("labels."):]) if k.startswith("labels.") else i.get(k)) == v
            for k, v in want)]
        page = self._page(hits, query)
        items: dict[str, dict] = {}
        for zone, inst in page["items"]:
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
        page.update(items=items, kind="compute#instanceAggregatedList",
                    id=f"projects/{project}/aggregated/instances",
                    selfLink=f"{API}/projects/{project}/aggregated/instances")
        return page, "InstanceAggregatedList"

    # -- OS Login

    def oslogin_import(self, *, user, query, body, **_):
        from urllib.parse import unquote

        account = unquote(user)
        unknown = set(body) - OSLOGIN_FIELDS["SshPublicKey"]
        if unknown or set(body) & {"fingerprint", "name"}:
            raise HttpError(400, f"Invalid JSON payload received. Unknown or output-only "
                                 f"field {sorted(unknown or set(body) & {'fingerprint', 'name'})}")
        key = body.get("key", "")
        if not re.fullmatch(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+( .*)?",
                            key):
            raise HttpError(400, "Invalid SSH public key")
        exp = body.get("expirationTimeUsec", "0")
        if not re.fullmatch(r"\d+", str(exp)):
            raise HttpError(400, "Invalid value at 'ssh_public_key.expiration_time_usec'")
        user_rec = self.fake.os_login.get(account)
        if user_rec is None or "username" not in user_rec:
            raise HttpError(403, f"The caller does not have permission to manage {account}",
                            "forbidden", "PERMISSION_DENIED")
        import hashlib

        fp = hashlib.sha256(key.split()[1].encode()).hexdigest()
        user_rec["keys"][fp] = {"key": key, "expirationTimeUsec": str(exp), "fingerprint": fp,
                                "name": f"users/{account}/sshPublicKeys/{fp}"}
        project = query.get("projectId", "")
        name, uid = user_rec["username"], str(user_rec["uid"])
        posix = [{"primary": True, "username": name, "uid": uid, "gid": uid,
                  "homeDirectory": f"/home/{name}", "shell": "/bin/bash", "gecos": account,
                  "systemId": "", "accountId": project, "operatingSystemType": "LINUX",
                  "name": f"users/{account}/projects/{project}"}] if project else []
        profile = {"name": account, "posixAccounts": posix,
                   "sshPublicKeys": copy.deepcopy(user_rec["keys"])}
        return {"loginProfile": profile, "details": ""}, "ImportSshPublicKeyResponse"

    def oslogin_delete(self, *, user, fp, **_):
        from urllib.parse import unquote

        account = unquote(user)
        keys = self.fake.os_login.get(account, {}).get("keys", {})
        if fp not in keys:
            raise _not_found(f"users/{account}/sshPublicKeys/{fp}")
        del keys[fp]
        return {}, "Empty"

    def fr_list(self, *, project, region, query, **_):
        self._region(project, region)
        items = [r for k, r in sorted(self.fake.forwarding_rules.items())
                 if k[:2] == (project, region)]
        out = self._page(items, query)
        out.update(kind="compute#forwardingRuleList",
                   id=f"projects/{project}/regions/{region}/forwardingRules",
                   selfLink=f"{API}/projects/{project}/regions/{region}/forwardingRules")
        return out, "ForwardingRuleList"

    def log_list(self, *, body, **_):
        return _log_list(self.fake, body), "ListLogEntriesResponse"

    def ts_list(self, *, project, query, **_):
        return _ts_list(self.fake, project, query), "ListTimeSeriesResponse"

    def ts_create(self, *, project, body, **_):
        _ts_create(self.fake, project, body)
        return {}, "Empty"

    def node_keys(self, *, query, **_):
        """What a node's sshd is handed for POSIX user `user` on VM `instance_id`."""
        import time

        name, user = query.get("instance_id", ""), query.get("user", "")
        running = any(mi["name"] == name and mi["instanceStatus"] == "RUNNING"
                      for lst in self.fake.managed.values() for mi in lst)
        now_us = int(time.time() * 1_000_000)
        keys = [k["key"] for rec in self.fake.os_login.values() if running
                and rec.get("username") == user for k in rec["keys"].values()
                if int(k["expirationTimeUsec"]) > now_us]
        return {"keys": keys}, "NodeKeys"


# Cloud Monitoring v3 REST reference (monitoring.googleapis.com): projects.timeSeries.list's
# query parameters and the fields of the messages its answer holds. Checked against
# google-cloud-monitoring's message types when that library is installed (it is not a
# dependency of poolctl, which reads the metric over REST), else against these names.
TS_LIST_PARAMS = {"filter", "interval.startTime", "interval.endTime", "view", "pageSize",
                  "pageToken", "orderBy", "aggregation.alignmentPeriod",
                  "aggregation.perSeriesAligner", "aggregation.crossSeriesReducer",
                  "aggregation.groupByFields"}
MONITORING_FIELDS: dict[str, set[str]] = {
    "ListTimeSeriesResponse": {"timeSeries", "nextPageToken", "executionErrors", "unit"},
    "TimeSeries": {"metric", "resource", "metadata", "metricKind", "valueType", "points",
                   "unit", "description"},
    "Metric": {"type", "labels"},
    "MonitoredResource": {"type", "labels"},
    "Point": {"interval", "value"},
    "TimeInterval": {"endTime", "startTime"},
    "TypedValue": {"boolValue", "int64Value", "doubleValue", "stringValue",
                   "distributionValue"},
}


def _check_time_series(out: dict) -> None:
    monitoring_v3: Any  # google-cloud-monitoring is optional (not a dependency)
    try:
        monitoring_v3 = importlib.import_module("google.cloud.monitoring_v3")
    except ImportError:
        monitoring_v3 = None
    if monitoring_v3 is not None:
        from google.protobuf import json_format

        json_format.Parse(json.dumps(out), monitoring_v3.ListTimeSeriesResponse.pb()(),
                          ignore_unknown_fields=False)
        return

    def check(data: dict, kind: str) -> None:
        unknown = set(data) - MONITORING_FIELDS[kind]
        if unknown:
            raise ValueError(f"{kind} has no field {sorted(unknown)}")

    check(out, "ListTimeSeriesResponse")
    for ts in out.get("timeSeries", []):
        check(ts, "TimeSeries")
        check(ts["metric"], "Metric")
        check(ts["resource"], "MonitoredResource")
        for p in ts["points"]:
            check(p, "Point")
            check(p["interval"], "TimeInterval")
            check(p["value"], "TypedValue")


def _ts_list(fake: FakeGce, project: str, query: dict) -> dict:
    """projects.timeSeries.list without aggregation: the series matching `filter` (one
    metric type required, as the API requires) with their points whose end time lies in
    [interval.startTime, interval.endTime], newest first; series without any are left out."""
    unknown = set(query) - TS_LIST_PARAMS
    if unknown:
        raise HttpError(400, f"Invalid JSON payload received. Unknown name {sorted(unknown)}")
    if project not in fake.projects:
        raise _not_found(f"projects/{project}")
    want = _parse_filter(query.get("filter", ""))
    if [k for k, _ in want].count("metric.type") != 1:
        raise HttpError(400, "Field filter had an invalid value: a filter must have exactly "
                             "one metric type")
    if "interval.endTime" not in query:
        raise HttpError(400, "Field interval.endTime had an invalid value")

    def when(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    end = when(query["interval.endTime"])
    start = when(query.get("interval.startTime", query["interval.endTime"]))

    def field(ts: dict, key: str) -> str | None:
        head, _, rest = key.partition(".")
        if rest.startswith("labels."):
            return ts[head]["labels"].get(rest[len("labels."):])
        return ts[head].get(rest)

    hits = []
    for ts in fake.time_series:
        if ts["resource"]["labels"].get("project_id") != project:
            continue
        if not all(field(ts, k) == v for k, v in want):
            continue
        if any(k.startswith("aggregation.") for k in query):
            hits.append(ts)  # aligned over the whole history below
            continue
        points = [p for p in ts["points"] if start <= when(p["interval"]["endTime"]) <= end]
        if points:
            hits.append({**copy.deepcopy(ts), "points": copy.deepcopy(points)})
    if any(k.startswith("aggregation.") for k in query):
        hits = _ts_aggregate(hits, start, end, query)
    size = int(query.get("pageSize") or fake.page_size)
    first = int(query.get("pageToken") or 0)
    out: dict[str, Any] = {"timeSeries": hits[first:first + size]}
    if first + size < len(hits):
        out["nextPageToken"] = str(first + size)
    return out


# What projects.timeSeries.create takes (CreateTimeSeriesRequest; the fields of each message
# as the v3 REST reference names them) and refuses, with the API's messages.
CREATE_FIELDS: dict[str, set[str]] = {
    "CreateTimeSeriesRequest": {"timeSeries"},
    "TimeSeries": {"metric", "resource", "metadata", "metricKind", "valueType", "points",
                   "unit", "description"},
    "Distribution": {"count", "mean", "sumOfSquaredDeviation", "range", "bucketOptions",
                     "bucketCounts", "exemplars"},
}
MAX_SERIES_PER_CREATE = 200
ALIGNERS = {"ALIGN_DELTA", "ALIGN_MEAN"}
REDUCERS = {"REDUCE_SUM", "REDUCE_MEAN"}


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _value(point: dict, vt: str) -> Any:
    """A point's value as Python: a number, or (bounds, counts, count, sum)."""
    v = point["value"]
    if vt == "DISTRIBUTION":
        d = v["distributionValue"]
        bounds = [float(b) for b in d.get("bucketOptions", {}).get(
            "explicitBuckets", {}).get("bounds", [])]
        counts = [int(c) for c in d.get("bucketCounts", [])]
        counts += [0] * (len(bounds) + 1 - len(counts))  # trailing zeros may be left out
        n = int(d.get("count", 0))
        return (tuple(bounds), counts, n, float(d.get("mean", 0.0)) * n)
    return float(v["int64Value"] if vt == "INT64" else v["doubleValue"])


def _distribution(bounds: tuple, counts: list[int], n: int, total: float) -> dict:
    return {"distributionValue": {
        "count": str(n), "mean": total / n if n else 0.0,
        "bucketOptions": {"explicitBuckets": {"bounds": list(bounds)}},
        "bucketCounts": [str(c) for c in counts]}}


def _ts_create(fake: FakeGce, project: str, body: dict) -> None:
    """projects.timeSeries.create, checked as Cloud Monitoring checks custom metrics: one
    point a series, GAUGE or CUMULATIVE (a custom metric cannot be DELTA), a CUMULATIVE
    point's start before its end and kept until a reset, points in time order, a
    distribution's count the sum of its bucket counts over increasing bounds."""
    def bad(i: int, what: str) -> HttpError:
        return HttpError(400, f"Field timeSeries[{i}].{what}")

    if project not in fake.projects:
        raise _not_found(f"projects/{project}")
    unknown = set(body) - CREATE_FIELDS["CreateTimeSeriesRequest"]
    if unknown:
        raise HttpError(400, f"Invalid JSON payload received. Unknown name {sorted(unknown)}")
    series = body.get("timeSeries") or []
    if not 1 <= len(series) <= MAX_SERIES_PER_CREATE:
        raise HttpError(400, f"Field timeSeries had an invalid value: between 1 and "
                             f"{MAX_SERIES_PER_CREATE} time series a request")
    for i, ts in enumerate(series):
        unknown = set(ts) - CREATE_FIELDS["TimeSeries"]
        if unknown:
            raise HttpError(400, f"Invalid JSON payload received. Unknown name "
                                 f"{sorted(unknown)} at 'time_series[{i}]'")
        mtype = ts.get("metric", {}).get("type", "")
        if not mtype.startswith("custom.googleapis.com/"):
            raise bad(i, f"metric.type had an invalid value of \"{mtype}\"")
        kind, vt = ts.get("metricKind", "GAUGE"), ts.get("valueType", "DOUBLE")
        if kind not in ("GAUGE", "CUMULATIVE"):
            raise bad(i, f"metricKind had an invalid value of \"{kind}\": a custom metric "
                         "is GAUGE or CUMULATIVE")
        if len(ts.get("points", [])) != 1:
            raise bad(i, "points had an invalid value: exactly one point is required")
        pt = ts["points"][0]
        end = _when(pt["interval"]["endTime"])
        start = pt["interval"].get("startTime")
        if kind == "CUMULATIVE" and (start is None or _when(start) >= end):
            raise bad(i, "points[0].interval.start_time had an invalid value: a CUMULATIVE "
                         "point's start time must be before its end time")
        if vt == "DISTRIBUTION":
            d = pt["value"].get("distributionValue", {})
            unknown = set(d) - CREATE_FIELDS["Distribution"]
            if unknown:
                raise HttpError(400, f"Invalid JSON payload received. Unknown name "
                                     f"{sorted(unknown)}")
            bounds, counts, n, _ = _value(pt, vt)
            if any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
                raise bad(i, "points[0].value.distribution_value.bucket_options had an "
                             "invalid value: bounds must be strictly increasing")
            if len(counts) > len(bounds) + 1 or sum(counts) != n or min(counts) < 0:
                raise bad(i, "points[0].value.distribution_value had an invalid value: "
                             "count must equal the sum of bucket_counts")
        else:
            _value(pt, vt)  # KeyError/ValueError: not a value of that type
        labels = ts.get("resource", {}).get("labels", {})
        if ts.get("resource", {}).get("type") != "gce_instance" or labels.get(
                "project_id") != project:
            raise bad(i, "resource had an invalid value: gce_instance of this project")
        old = next((t for t in fake.time_series if t["metric"] == {
            "labels": {}, **ts["metric"]} and t["resource"]["labels"] == labels), None)
        if old is not None:
            if (old["metricKind"], old["valueType"]) != (kind, vt):
                raise bad(i, f"metricKind had an invalid value: the metric is "
                             f"{old['metricKind']} {old['valueType']}")
            last = old["points"][0]["interval"]
            if _when(last["endTime"]) >= end:
                raise bad(i, "points[0].interval.end_time had an invalid value: Points must "
                             "be written in order. One or more of the points specified had "
                             "an older end time than the most recent point.")
            if kind == "CUMULATIVE" and _when(start) < _when(last["startTime"]):
                raise bad(i, "points[0].interval.start_time had an invalid value: a "
                             "CUMULATIVE point's start time cannot go back")
    for ts in series:  # all checked: the request is taken whole
        labels = ts["resource"]["labels"]
        metric = {"labels": {}, **ts["metric"]}
        old = next((t for t in fake.time_series if t["metric"] == metric
                    and t["resource"]["labels"] == labels), None)
        if old is None:
            old = {"metric": copy.deepcopy(metric), "resource": copy.deepcopy(ts["resource"]),
                   "metricKind": ts.get("metricKind", "GAUGE"),
                   "valueType": ts.get("valueType", "DOUBLE"), "points": []}
            fake.time_series.append(old)
        pt = copy.deepcopy(ts["points"][0])
        pt["interval"].setdefault("startTime", pt["interval"]["endTime"])
        old["points"].insert(0, pt)


def _aligned(ts: dict, a: datetime, b: datetime, aligner: str) -> Any:
    """One series' value over the period (a, b]: ALIGN_DELTA of a CUMULATIVE series, its
    increase (per start time: a newer start is a reset, counted from 0; the baseline is the
    newest point at or before `a` of the same start, else 0); ALIGN_MEAN of a GAUGE, the
    mean of its points. None: no point in the period."""
    vt = ts["valueType"]
    pts = [p for p in ts["points"] if a < _when(p["interval"]["endTime"]) <= b]
    if not pts:
        return None
    if aligner == "ALIGN_MEAN":
        if ts["metricKind"] != "GAUGE" or vt == "DISTRIBUTION":
            raise HttpError(400, "The aligner ALIGN_MEAN is not valid for this metric")
        return sum(_value(p, vt) for p in pts) / len(pts)
    if ts["metricKind"] != "CUMULATIVE":
        raise HttpError(400, "The aligner ALIGN_DELTA is not valid for a GAUGE metric")
    total: Any = None
    for start in {p["interval"]["startTime"] for p in pts}:
        seg = [p for p in ts["points"] if p["interval"]["startTime"] == start]
        last = max((p for p in seg if _when(p["interval"]["endTime"]) <= b),
                   key=lambda p: p["interval"]["endTime"])
        before = [p for p in seg if _when(p["interval"]["endTime"]) <= a]
        base = max(before, key=lambda p: p["interval"]["endTime"]) if before else None
        d = _minus(_value(last, vt), None if base is None else _value(base, vt))
        total = d if total is None else _plus(total, d)
    return total


def _minus(x: Any, y: Any) -> Any:
    if y is None:
        return x
    if isinstance(x, tuple):
        return (x[0], [c - d for c, d in zip(x[1], y[1], strict=True)], x[2] - y[2], x[3] - y[3])
    return x - y


def _plus(x: Any, y: Any) -> Any:
    if isinstance(x, tuple):
        if x[0] != y[0]:
            raise HttpError(400, "fake: distributions with different bounds cannot be summed")
        return (x[0], [c + d for c, d in zip(x[1], y[1], strict=True)], x[2] + y[2], x[3] + y[3])
    return x + y


def _ts_aggregate(hits: list[dict], start: datetime, end: datetime, query: dict) -> list[dict]:
    """The aggregated answer: each series aligned per period (the periods end at `end`,
    `aggregation.alignmentPeriod` long, back to `start`), then reduced across series (one
    series, without labels: no groupByFields); points newest first."""
    period = query.get("aggregation.alignmentPeriod", "")
    aligner = query.get("aggregation.perSeriesAligner", "")
    reducer = query.get("aggregation.crossSeriesReducer", "REDUCE_NONE")
    m = re.fullmatch(r"(\d+)s", period)
    if not m or int(m[1]) < 60:
        raise HttpError(400, "Field aggregation.alignmentPeriod had an invalid value: at "
                             "least 60s")
    if aligner not in ALIGNERS or reducer not in REDUCERS | {"REDUCE_NONE"}:
        raise HttpError(400, f"fake: aggregation {aligner}/{reducer} is not emulated")
    if query.get("aggregation.groupByFields"):
        raise HttpError(400, "fake: aggregation.groupByFields is not emulated")
    step = timedelta(seconds=int(m[1]))
    out: list[dict] = []
    groups = [[ts] for ts in hits] if reducer == "REDUCE_NONE" else ([hits] if hits else [])
    for group in groups:
        vt = group[0]["valueType"]
        kind = "DELTA" if aligner == "ALIGN_DELTA" else "GAUGE"
        rvt = "DOUBLE" if aligner == "ALIGN_MEAN" or reducer == "REDUCE_MEAN" else vt
        points = []
        b = end
        while b > start:
            a = b - step
            vals = [v for v in (_aligned(ts, a, b, aligner) for ts in group) if v is not None]
            if vals:
                if reducer == "REDUCE_MEAN":
                    v: Any = sum(vals) / len(vals)
                else:
                    v = vals[0]
                    for x in vals[1:]:
                        v = _plus(v, x)
                value = (_distribution(*v) if isinstance(v, tuple)
                         else {"int64Value": str(int(v))} if rvt == "INT64"
                         else {"doubleValue": float(v)})
                points.append({"interval": {"startTime": _ts(a), "endTime": _ts(b)},
                               "value": value})
            b = a
        if not points:
            continue
        first = group[0]
        out.append({
            "metric": first["metric"] if reducer == "REDUCE_NONE"
            else {"type": first["metric"]["type"]},
            "resource": first["resource"] if reducer == "REDUCE_NONE"
            else {"type": first["resource"]["type"],
                  "labels": {"project_id": first["resource"]["labels"]["project_id"]}},
            "metricKind": kind, "valueType": rvt, "points": points})
    return out


def _parse_filter(text: str) -> list[tuple[str, str]]:
    """`a = "x" AND labels.b = "y"`: the only filter shape poolctl sends; others are refused."""
    out = []
    for term in (t for t in text.split(" AND ") if t.strip()):
        m = re.fullmatch(r'\s*([A-Za-z][\w.-]*)\s*=\s*"([^"]*)"\s*', term)
        if not m:
            raise HttpError(400, f"fake: unsupported filter term {term!r}")
        out.append((m[1], m[2]))
    return out


# Cloud Logging v2 REST reference (logging.googleapis.com): entries.list's request body and
# the fields of the answer (google-cloud-logging is not installed: checked by these names).
LOG_LIST_BODY = {"resourceNames", "projectIds", "filter", "orderBy", "pageSize", "pageToken"}
LOGGING_FIELDS: dict[str, set[str]] = {
    "ListLogEntriesResponse": {"entries", "nextPageToken"},
    "LogEntry": {"logName", "resource", "protoPayload", "textPayload", "jsonPayload",
                 "timestamp", "receiveTimestamp", "severity", "insertId", "httpRequest",
                 "labels", "operation", "trace", "spanId", "traceSampled", "sourceLocation",
                 "split", "errorGroups", "apphub", "apphubDestination"},
}
# The filter poolctl sends: `a="x" AND b=("y" OR "z") AND timestamp>="T"`.
_LOG_TERM = re.compile(r'\s*([A-Za-z][\w.]*)\s*(>=|=)\s*(\("[^"]*"(?: OR "[^"]*")*\)|"[^"]*")\s*')


def _check_log_entries(out: dict) -> None:
    for kind, data in [("ListLogEntriesResponse", out)] + [
            ("LogEntry", e) for e in out.get("entries", [])]:
        unknown = set(data) - LOGGING_FIELDS[kind]
        if unknown:
            raise ValueError(f"{kind} has no field {sorted(unknown)}")


def _log_list(fake: FakeGce, body: dict) -> dict:
    """entries.list over `fake.log_entries`: the filter shape above, `timestamp asc|desc`."""
    unknown = set(body) - LOG_LIST_BODY
    if unknown:
        raise HttpError(400, f"Invalid JSON payload received. Unknown name {sorted(unknown)}")
    projects = {r.split("/", 1)[1] for r in body.get("resourceNames", [])
                if r.startswith("projects/")}
    terms = []
    for term in (t for t in body.get("filter", "").split(" AND ") if t.strip()):
        m = _LOG_TERM.fullmatch(term)
        if not m:
            raise HttpError(400, f"fake: unsupported filter term {term!r}")
        terms.append((m[1], m[2], re.findall(r'"([^"]*)"', m[3])))

    def value(e: dict, key: str) -> str | None:
        node: Any = e
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def keep(e: dict) -> bool:
        if e["resource"]["labels"].get("project_id") not in projects:
            return False
        for key, op, values in terms:
            v = value(e, key)
            if op == ">=" and not (v is not None and v >= values[0]):  # RFC 3339 UTC: text order
                return False
            if op == "=" and v not in values:
                return False
        return True

    hits = sorted((e for e in fake.log_entries if keep(e)), key=lambda e: e["timestamp"],
                  reverse=body.get("orderBy", "timestamp asc") == "timestamp desc")
    size, first = int(body.get("pageSize") or fake.page_size), int(body.get("pageToken") or 0)
    out: dict[str, Any] = {"entries": copy.deepcopy(hits[first:first + size])}
    if first + size < len(hits):
        out["nextPageToken"] = str(first + size)
    return out


# ---------------------------------------------------------------------------------- CLI

def seed_pool(fake: FakeGce, cfg, pool) -> dict:
    """Deploy `pool` into the fake as `poolctl deploy --cloud gcp` leaves it (stacks/gcp:
    names, labels, zones, sizes, standby pool, autoscaler, surge), with room in every quota
    its peak needs (twice that granted)."""
    from poolctl.contract import gcp as contract
    from poolctl.sizing import gcp_zones, instance_row, plan_pool

    row = instance_row(pool, Cloud.gcp)
    plan = plan_pool(pool, Cloud.gcp)
    zones = gcp_zones(pool, row)
    sizes = contract.mig_sizes(pool, plan, len(zones))
    name = naming.base(cfg, pool)
    p = pool.gcp
    quotas: dict[str, tuple[float, float]] = {
        q.name: (2 * q.needed, 0) for q in plan.quotas if q.scope != "global"}
    fake.add_region(p.project, p.region, zones, quotas=quotas)
    for q in plan.quotas:
        if q.scope == "global":
            fake.set_project_quota(p.project, q.name, 2 * q.needed)
    return fake.deploy_pool(
        project=p.project, region=p.region, name=naming.short(name, 63),
        labels=naming.gcp_labels(cfg, pool), zones=zones, machine_type=row.name,
        template=f"{naming.short(name, 36)}-20260105090000000000000001",
        running=sizes.target_size, stopped=sizes.standby, standby_delay=min(
            3600, int(plan.start_seconds["cold"])), max_surge=sizes.max_surge,
        autoscaler=(sizes.min_nodes, sizes.max_nodes), queue_target=pool.scaling.queue_target,
        fallback_machine_types=tuple(p.fallback_machine_types))


def stand_in_rollout(fake: FakeGce, cfg, path, pool, image: str) -> None:
    """`poolctl rollout start --cloud gcp --image IMAGE --no-wait`, its Terraform apply
    stood in for (the google provider is not in the offline mirror): the apply's part, a new
    labelled template, is made in the fake; the rest is poolctl's own code (file edit,
    record, quota check, the canary's first step)."""
    import contextlib
    import sys

    import pytest

    from poolctl.clouds.gcp.ops import make_ops
    from tests.fakes.stack import StoodInStack, stand_in, start_rollout

    def apply() -> None:
        with fake.lock:
            n = sum(1 for (proj, _t) in fake.templates if proj == pool.gcp.project)
        fake.add_template(pool.gcp.project,
                          f"{naming.short(naming.base(cfg, pool), 36)}-202602010900000000000000"
                          f"{n + 1:02d}", labels=naming.gcp_labels(cfg, pool),
                          machine_type=pool.gcp.machine_type)

    # This process only (no undo): the stand-in for Terraform's apply, which takes no outdir.
    stand_in(pytest.MonkeyPatch(), StoodInStack(naming.stack_name(cfg, pool, Cloud.gcp), ".",
                                                on_apply=apply))
    with contextlib.redirect_stdout(sys.stderr):  # stdout: the export line
        start_rollout(cfg, path, pool, Cloud.gcp, make_ops(), image=image,
                      outdir=Path("cdktf.out"))


def main(argv: list[str] | None = None) -> None:
    """Serve the fake on 127.0.0.1 with the file's GCP pools deployed in it; `--tick S`
    lets GCE move on every S seconds (each update replaces up to its surge of VMs, new VMs
    come up healthy). Point poolctl at it with POOLCTL_GCE_ENDPOINT."""
    import argparse
    import os
    import time
    from pathlib import Path

    from poolctl.config import load_config

    ap = argparse.ArgumentParser(prog="python -m tests.fakes.gce", description=main.__doc__)
    ap.add_argument("file", type=Path, help="poolctl.yaml whose gcp: pools to deploy")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--tick", type=float, default=0, help="seconds between GCE's steps")
    ap.add_argument("--capacity", action="append", default=[], metavar="MACHINE@ZONE=N",
                    help="the zone runs at most N VMs of the machine type (repeatable)")
    ap.add_argument("--rollout-image", metavar="IMAGE",
                    help="then play `poolctl rollout start --image IMAGE --no-wait` with "
                         "Terraform's apply stood in for (it edits the file)")
    args = ap.parse_args(argv)
    path = args.file.resolve()
    cfg = load_config(path)
    pools = [p for p in cfg.pools if p.gcp is not None]
    fake = FakeGce()
    for item in args.capacity:
        m = re.fullmatch(r"([a-z0-9-]+)@([a-z0-9-]+)=(\d+)", item)
        if m is None:
            ap.error(f"--capacity {item}: write MACHINE@ZONE=N, e.g. a3-highgpu-8g@us-central1-a=1")
        fake.set_capacity(m[2], m[1], int(m[3]))
    handler = type("Handler", (_Handler,), {"fake": fake})
    fake._server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    fake._server.daemon_threads = True
    threading.Thread(target=fake._server.serve_forever, daemon=True).start()
    for pool in pools:
        out = seed_pool(fake, cfg, pool)
        print(f"{pool.name}: MIG {out['mig']} on {out['template']}", flush=True)
    os.environ["POOLCTL_GCE_ENDPOINT"] = fake.endpoint
    if args.rollout_image:
        stand_in_rollout(fake, cfg, path, pools[0], args.rollout_image)
    print(f"export POOLCTL_GCE_ENDPOINT={fake.endpoint}", flush=True)
    try:
        while True:
            time.sleep(args.tick or 3600)
            if args.tick:
                with fake.lock:
                    for key, mig in fake.migs.items():
                        fake.step_rollout(*key, mig["updatePolicy"]["maxSurge"]["fixed"] or 1)
                    fake.settle()
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
