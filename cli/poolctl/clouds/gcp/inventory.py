"""GCP, read-only: the pool's endpoint (`status`), the pools deployed in a region (`ls`) and
the pool's VM logs (`logs`), through the clients, endpoint override, retries and one-line
errors of `GceApi` and the MIG reads of `MigReader`.

- Endpoint: the regional forwarding rule carrying the pool's labels (the stack labels it):
  its address and port; https when its target is an HTTPS proxy (a certificate is set).
- Pools: MIGs carry no labels, so a MIG is a pool's when its instance template carries the
  contract's labels (as `GcpOps.find_group`); the model is in the template's description,
  which the stack writes as `poolctl NAME: MODEL vVERSION`.
- Logs: Cloud Logging `entries:list` (REST, as Cloud Monitoring is read) for the MIG's VMs.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.gcp.api import link_name
from poolctl.clouds.gcp.mig import MigReader, mig_ref, target_version
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed
from poolctl.inventory import Endpoint, LogEvent, PoolRow, rfc3339_ms

LOGGING_API = "https://logging.googleapis.com"
LOG_PAGE_SIZE = 1000
_DESCRIPTION = re.compile(r"poolctl \S+: (\S+) v\S+")


def _ms(text: str) -> int:
    # RFC 3339 with up to nanoseconds; Python parses microseconds at most.
    head, _, frac = text.rstrip("Z").partition(".")
    t = datetime.fromisoformat(head).replace(tzinfo=UTC)
    return int(t.timestamp() * 1000) + int((frac + "000")[:3] or 0)


class GcpInventory(MigReader):
    """What `status`, `ls` and `logs` read on GCP (part of `GcpOps`)."""

    def endpoint(self, cfg: Config, pool: Pool) -> Endpoint | None:
        p = pool.gcp
        assert p is not None  # called for the pool's gcp placement
        labels = naming.gcp_labels(cfg, pool)
        rules = [r for r in self.call("list forwarding rules",
                                      self.client("ForwardingRulesClient").list,
                                      project=p.project, region=p.region)
                 if all(r.labels.get(k) == v for k, v in labels.items())]
        if not rules:
            return None
        if len(rules) > 1:
            raise OperationFailed(f"pool {pool.name}: {len(rules)} forwarding rules in "
                                  f"{p.project}/{p.region} carry its labels "
                                  f"({', '.join(r.name for r in rules)}); delete the stray "
                                  "ones")
        r = rules[0]
        port = int((r.port_range or "80").split("-")[0])
        return Endpoint(scheme="https" if "/targetHttpsProxies/" in r.target else "http",
                        host=r.I_p_address, port=port,
                        internal=r.load_balancing_scheme.startswith("INTERNAL"),
                        api_key_secret=pool.api_key_secret(Cloud.gcp))

    def list_pools(self, region: str, project: str | None) -> list[PoolRow]:
        """The MIGs in `project`/`region` whose template carries `poolctl-role=inference`."""
        # `project` is optional for the aws module's sake; `ls --cloud gcp` always gives one.
        assert project is not None
        templates = {t.name: t for t in self.labelled_templates(
            project, {naming.LABEL_ROLE: naming.ROLE})}
        migs = self.call("list MIGs", self.client("RegionInstanceGroupManagersClient").list,
                         project=project, region=region)
        scalers = {link_name(a.target): a.autoscaling_policy
                   for a in self.call("list autoscalers",
                                      self.client("RegionAutoscalersClient").list,
                                      project=project, region=region)}
        rows = []
        for m in migs:
            target, _ = target_version(m)
            t = templates.get(link_name(target).split("?", 1)[0])
            if t is None:
                continue
            labels = t.properties.labels
            pol = scalers.get(m.name)
            running = sum(mi.instance_status == "RUNNING" and mi.current_action == "NONE"
                          for mi in self.managed_instances(project, region, m.name))
            model = _DESCRIPTION.fullmatch(t.description or "")
            rows.append(PoolRow(
                project=labels.get(naming.LABEL_PROJECT, ""),
                pool=labels.get(naming.LABEL_POOL, ""),
                cloud=Cloud.gcp, region=region, group=m.name,
                nodes={"min": pol.min_num_replicas if pol else m.target_size,
                       "desired": m.target_size,
                       "max": pol.max_num_replicas if pol else m.target_size,
                       "in_service": running},
                model=model.group(1) if model else None))
        return sorted(rows, key=lambda r: (r.project, r.pool))

    def log_events(self, cfg: Config, pool: Pool, start_ms: int) -> list[LogEvent]:
        """Cloud Logging entries of the pool's VMs (those the MIG holds now) from `start_ms`
        on, oldest first. The caller needs roles/logging.viewer."""
        group = self.find_group(cfg, pool)
        project, region, name = mig_ref(group)
        vms = {str(mi.id): link_name(mi.instance)
               for mi in self.managed_instances(project, region, name) if mi.id}
        if not vms:
            return []
        ids = " OR ".join(f'"{i}"' for i in sorted(vms))
        body = {"resourceNames": [f"projects/{project}"], "orderBy": "timestamp asc",
                "pageSize": LOG_PAGE_SIZE,
                "filter": f'resource.type="gce_instance" AND '
                          f'resource.labels.instance_id=({ids}) '
                          f'AND timestamp>="{rfc3339_ms(start_ms)}"'}
        out = []
        while True:
            page = self.google_rest("POST", LOGGING_API, "v2/entries:list",
                                    f"read the logs of {name}", api="Logging",
                                    role="roles/logging.viewer", json=body)
            for e in page.get("entries", []):
                vm = e.get("resource", {}).get("labels", {}).get("instance_id", "")
                msg = e.get("textPayload")
                if msg is None:
                    msg = str((e.get("jsonPayload") or {}).get("message",
                                                               e.get("jsonPayload", "")))
                out.append(LogEvent(timestamp_ms=_ms(e["timestamp"]), source=vms.get(vm, vm),
                                    message=msg, id=e.get("insertId", "")))
            if not page.get("nextPageToken"):
                return out
            body["pageToken"] = page["nextPageToken"]
