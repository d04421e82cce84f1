"""The pool itself: instance template, health checks, regional MIG with its standby pool, and
the internal Application Load Balancer in front of it."""

from __future__ import annotations

import re
from typing import Any

from cdktn import (
    Op,
    TerraformResourceLifecycle,
    TerraformVariable,
    TerraformVariableValidationConfig,
)
from constructs import Construct

from poolctl import naming
from poolctl.bootscript import LIB_IMAGE_TAG, boot_library
from poolctl.catalog import InstanceType
from poolctl.config import GcpCapacity, Pool
from poolctl.contract import gcp as contract
from poolctl.contract.gcp import MigSizes
from poolctl.sizing import PoolPlan, gcp_zones
from poolctl_stacks._providers import google
from poolctl_stacks.base import STICKY_COOKIE_S
from poolctl_stacks.gcp.network import Network
from poolctl_stacks.literal import escape, hcl_quoted

# Boot disk per machine series. A3 Ultra and A4 take Hyperdisk only; A2 takes Persistent
# Disk only (no Hyperdisk Balanced); A3 High/Edge/Mega take both. On the PD series we use
# pd-ssd, not pd-balanced: the boot disk receives the serving image (~25 GB unpacked) on
# every cold start and is the one disk a stopped standby node keeps, and pd-ssd's per-disk
# baseline (6,000 IOPS, 240 MiB/s) against pd-balanced's (3,000, 140 MiB/s) shortens that
# step for about 14 USD a month per node. Weights never touch it (they go to Local SSD).
# Every Compute Engine disk is encrypted at rest with Google-managed keys.
HYPERDISK_ONLY_PREFIXES = ("a3-ultragpu", "a4-", "a4x-")
MAX_DELAY_S = 3600  # API ceiling of autohealing and standby initial delays
LB_PORT = 80
HTTPS_PORT = 443


def image_lookup(image: str, project: str) -> dict[str, str]:
    """`gcp.image` (as the instance template takes it) as the image data source's arguments:
    a family (`family/F`, `[projects/P/]global/images/family/F`) or an image
    (`[projects/P/]global/images/N`, `P/N`, `N`), URLs included. A bare `N` reads as an image
    name; a family is written with `family/`."""
    ref = re.sub(r"^https://[^/]+/compute/[^/]+/", "", image)
    if m := re.fullmatch(r"(?:projects/([^/]+)/)?(?:global/images/)?(family/)?([^/]+)", ref):
        return {"project": m[1] or project, ("family" if m[2] else "name"): m[3]}
    if m := re.fullmatch(r"([^/]+)/([^/]+)", ref):
        return {"project": m[1], "name": m[2]}
    return {"project": project, "name": image}  # no image by that name: the plan says so


def boot_disk_type(machine_type: str) -> str:
    return "hyperdisk-balanced" if machine_type.startswith(HYPERDISK_ONLY_PREFIXES) else "pd-ssd"



def reservation_affinity(t: Any, cap: GcpCapacity) -> dict[str, Any]:
    """The instance template's reservation_affinity; nothing for GCE's default (ANY), so a
    pool without gcp.capacity synthesizes as before."""
    if cap.reservations == "any":
        return {}
    if cap.reservations == "none":
        return {"reservation_affinity": t.ComputeInstanceTemplateReservationAffinity(
            type="NO_RESERVATION")}
    # The key GCE matches a specific reservation by (Compute API reference,
    # instances: reservationAffinity).
    return {"reservation_affinity": t.ComputeInstanceTemplateReservationAffinity(
        type="SPECIFIC_RESERVATION",
        specific_reservation=t.ComputeInstanceTemplateReservationAffinitySpecificReservation(
            key="compute.googleapis.com/reservation-name", values=cap.names))}

class NodeGroup(Construct):
    def __init__(self, scope: Construct, id: str, *, pool: Pool, row: InstanceType,
                 plan: PoolPlan, name: str, net: Network, node_tag: str, sa_email: str,
                 user_data: str, image_user_data: str, labels: dict[str, str]) -> None:
        super().__init__(scope, id)
        p = pool.gcp
        assert p is not None  # a gcp stack: the pool has a gcp placement
        port = pool.serving.port
        cold = int(plan.start_seconds["cold"])
        zones = gcp_zones(pool, row)  # rule region-offered: never empty
        sizes = contract.mig_sizes(pool, plan, len(zones))

        # The boot script: the image variant on an image `poolctl image build` made with
        # this very boot library (its label names the version), else the whole script,
        # chosen at plan time from the image itself (as on AWS: poolctl_stacks/aws/pool.py).
        node_image = google("data_google_compute_image").DataGoogleComputeImage(
            self, "node-image", **image_lookup(p.image, p.project),
        )
        # Metadata values are templates to Terraform, and bash's `${x##*/}` is not one:
        # escaped, and quoted as HCL strings inside the choice, Terraform hands either
        # script over unchanged. (AWS user data is base64, which has no `${`.)
        startup_script = (
            f"${{lookup(data.google_compute_image.{node_image.friendly_unique_id}.labels, "
            f"{hcl_quoted(LIB_IMAGE_TAG['gcp'])}, \"\") == "
            f"{hcl_quoted(boot_library('gcp')['version'])} ? "
            f"{hcl_quoted(escape(image_user_data))} : {hcl_quoted(escape(user_data))}}}"
        )

        t = google("compute_instance_template")
        disks = [t.ComputeInstanceTemplateDisk(
            boot=True, auto_delete=True, source_image=p.image, disk_size_gb=p.boot_disk_gb,
            disk_type=boot_disk_type(row.name), labels=labels,
        )]
        # The catalog's Local SSDs, NVMe-attached: the weights cache. For types that bundle
        # them (A3, A2 Ultra) the count must equal the bundle; A2 High takes them optionally.
        disks += [
            t.ComputeInstanceTemplateDisk(
                type="SCRATCH", disk_type="local-ssd", interface="NVME",
                disk_size_gb=int(row.local_nvme.size_gb), auto_delete=True,
            )
            for _ in range(row.local_nvme.count)
        ]
        self.template = t.ComputeInstanceTemplate(
            self, "template", name_prefix=f"{naming.short(name, 36)}-", project=p.project,
            region=p.region, machine_type=row.name,
            description=f"poolctl {name}: {pool.model.id} v{pool.model.version}",
            # No guest_accelerator: accelerator-optimized types come with their GPUs.
            disk=disks,
            # One gVNIC (A3 requires gVNIC), no access_config: no external IP. No GPUDirect
            # NICs: replicas never talk across nodes.
            network_interface=[t.ComputeInstanceTemplateNetworkInterface(
                network=net.network, subnetwork=net.subnetwork, nic_type="GVNIC",
            )],
            can_ip_forward=False,
            service_account=t.ComputeInstanceTemplateServiceAccount(
                email=sa_email, scopes=["cloud-platform"],
            ),
            shielded_instance_config=t.ComputeInstanceTemplateShieldedInstanceConfig(
                enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True,
            ),
            scheduling=t.ComputeInstanceTemplateScheduling(
                on_host_maintenance="TERMINATE", automatic_restart=True,
                provisioning_model="STANDARD", preemptible=False,
            ),
            metadata={
                "enable-oslogin": "TRUE",
                "block-project-ssh-keys": "TRUE",
                "serial-port-enable": "FALSE",
                "startup-script": startup_script,
            },
            tags=[node_tag],
            labels=labels,
            **reservation_affinity(t, p.capacity),
            # A new template per change (name_prefix: a fresh name per content version),
            # created before the old one goes. Terraform would then delete the old one,
            # which the MIG still runs (its versions are poolctl's, see below) and the
            # rollback target: `rollout start` and `deploy` keep it by removing it from the
            # state before the apply (Terraform forgets it instead of deleting it), and
            # templates that are neither current nor previous are deleted after a rollout's
            # apply and after its end (poolctl.clouds.gcp.rollout: rollout_before_apply,
            # rollout_cleanup).
            lifecycle=TerraformResourceLifecycle(
                create_before_destroy=True, precondition=[net.pga_precondition],
            ),
        )

        hc = google("compute_region_health_check")
        http = {"port": port, "request_path": pool.serving.health_path}
        # Load balancer check: quick in, quick out (as the AWS target group).
        self.lb_check = hc.ComputeRegionHealthCheck(
            self, "lb-check", name=f"{naming.short(name, 54)}-lb", project=p.project,
            region=p.region, check_interval_sec=15, timeout_sec=5, healthy_threshold=2,
            unhealthy_threshold=3, http_health_check=http, log_config={"enable": True},
        )
        # Autohealing check: recreating an 8-GPU node costs a cold start, so only a node
        # failing for 5 minutes is replaced, not one whose engine stalled briefly.
        self.heal_check = hc.ComputeRegionHealthCheck(
            self, "heal-check", name=f"{naming.short(name, 52)}-heal", project=p.project,
            region=p.region, check_interval_sec=30, timeout_sec=10, healthy_threshold=1,
            unhealthy_threshold=10, http_health_check=http, log_config={"enable": True},
        )

        self._variables(pool, plan, sizes, len(zones))
        m = google("compute_region_instance_group_manager")
        mig_kw: dict[str, Any] = {}
        if p.fallback_machine_types:
            # Instance flexibility: the MIG creates the primary type first, then each
            # fallback in rank order, where there is capacity ("About instance flexibility
            # in MIGs", docs/cloud-facts.md). No standby pool beside it (rule
            # fallback-warm-pool).
            mig_kw["instance_flexibility_policy"] = (
                m.ComputeRegionInstanceGroupManagerInstanceFlexibilityPolicy(instance_selections=[
                    m.ComputeRegionInstanceGroupManagerInstanceFlexibilityPolicyInstanceSelections(
                        name=f"rank-{rank}", rank=rank, machine_types=[machine_type])
                    for rank, machine_type in enumerate([row.name, *p.fallback_machine_types])
                ]))
        elif pool.warm_pool.state != "running":
            # Also with no warm pool in the file (an empty standby pool costs nothing):
            # `warm --replicas N` may fill it at runtime, the apply of a later rollout keeps
            # it (var.warm_nodes), and new standby VMs get the initial delay.
            mig_kw["standby_policy"] = m.ComputeRegionInstanceGroupManagerStandbyPolicy(
                # Let a fresh VM finish its first boot (image pulled onto the boot disk)
                # before the MIG stops it.
                mode="SCALE_OUT_POOL", initial_delay_sec=min(MAX_DELAY_S, cold),
            )
            key = "target_suspended_size" if p.standby_suspended else "target_stopped_size"
            mig_kw[key] = self.warm_nodes.number_value
        self.mig = m.ComputeRegionInstanceGroupManager(
            self, "mig", name=naming.short(name, 63), project=p.project, region=p.region,
            base_instance_name=naming.short(name, 50),
            # Static: a changed description would replace the whole group.
            description=f"poolctl pool {name}",
            version=[m.ComputeRegionInstanceGroupManagerVersion(
                name=contract.VERSION_PRIMARY, instance_template=self.template.self_link_unique,
            )],
            distribution_policy_zones=zones,
            # BALANCED: spread over the zones for availability, but create where H100/A100
            # capacity exists instead of stalling on a stocked-out zone as EVEN does; ANY
            # could put the whole pool in one zone.
            distribution_policy_target_shape="BALANCED",
            target_size=sizes.target_size,
            **mig_kw,
            named_port=[m.ComputeRegionInstanceGroupManagerNamedPort(name="http", port=port)],
            auto_healing_policies=m.ComputeRegionInstanceGroupManagerAutoHealingPolicies(
                health_check=self.heal_check.id, initial_delay_sec=min(MAX_DELAY_S, cold),
            ),
            instance_lifecycle_policy=(
                m.ComputeRegionInstanceGroupManagerInstanceLifecyclePolicy(
                    default_action_on_failure="REPAIR", force_update_on_repair="YES",
                )
            ),
            update_policy=m.ComputeRegionInstanceGroupManagerUpdatePolicy(
                type="PROACTIVE", minimal_action="REPLACE",
                most_disruptive_allowed_action="REPLACE", replacement_method="SUBSTITUTE",
                # Non-EVEN shapes require redistribution off; moving a serving GPU node to
                # another zone would cost a cold start anyway.
                instance_redistribution_type="NONE",
                max_surge_fixed=self.max_surge_fixed.number_value,
                max_unavailable_fixed=self.max_unavailable_fixed.number_value,
            ),
            # GPU capacity can take long to find; Terraform must not block on it.
            wait_for_instances=False,
            # poolctl sizes the group at runtime (autoscaler, warm) and steps its versions
            # through a rollout's checkpoints (a canary beside the old template; the names
            # in poolctl.contract.gcp): Terraform owns the shape and creates the first
            # version, and an apply of a new template leaves the rollout to poolctl, so a
            # `deploy` never undoes one in progress.
            lifecycle=TerraformResourceLifecycle(ignore_changes=["target_size", "version"]),
        )
        self.sizes = sizes
        self.zones = zones

    def _variables(self, pool: Pool, plan: PoolPlan, sizes: MigSizes, zones: int) -> None:
        """Sizes that poolctl's runtime commands change, as Terraform variables (names,
        defaults and meaning: poolctl.contract.gcp).

        `deploy` applies the defaults (the file's sizes); `rollout start` passes TF_VAR_...
        with what the group runs now (`GcpOps.rollout_apply_env`), so that the apply writing
        a new template keeps what `warm` changed, and with `--no-surge` rolls one node per
        zone at a time.
        """
        v = {}
        for spec, default in contract.stack_variables(plan, sizes):
            validation = None
            if spec in contract.ZONE_RULED:
                # A bad value fails the plan with this line instead of the API call.
                validation = [TerraformVariableValidationConfig(
                    condition=f"${{var.{spec.name} == 0 || var.{spec.name} >= {zones}}}",
                    error_message=f"{spec.name}: give 0 or at least {zones} (the MIG's zones).")]
            v[spec] = TerraformVariable(self, spec.name, type=spec.type, default=default,
                                        description=spec.description, validation=validation)
            v[spec].override_logical_id(spec.name)  # a stable name for TF_VAR_<name>
        self.min_nodes, self.max_nodes = v[contract.MIN_NODES], v[contract.MAX_NODES]
        self.warm_nodes = v[contract.WARM_NODES]
        self.max_surge_fixed = v[contract.MAX_SURGE_FIXED]
        self.max_unavailable_fixed = v[contract.MAX_UNAVAILABLE_FIXED]
        serving_min = self.min_nodes.number_value
        if pool.warm_pool.state == "running":
            serving_min = Op.add(serving_min, self.warm_nodes.number_value)
        self.autoscaler_min = serving_min
        self.autoscaler_max = self.max_nodes.number_value


def certificate_link(cert: str, project: str, region: str) -> str:
    """gcp.certificate as the proxy takes it: a bare name is a regional certificate of the
    placement's project and region."""
    if "/" in cert:
        return cert
    return f"projects/{project}/regions/{region}/sslCertificates/{cert}"


class LoadBalancer(Construct):
    """Internal regional Application Load Balancer. LEAST_REQUEST suits long, uneven LLM
    requests; a 600 s backend timeout lets a streamed answer finish (as the AWS ALB's idle
    timeout). Clients inside the VPC reach it; the VPC firewall cannot filter clients of an
    Envoy-based load balancer, so `gcp.client_cidrs` is not enforced here."""

    def __init__(self, scope: Construct, id: str, *, pool: Pool, name: str, net: Network,
                 nodes: NodeGroup, labels: dict[str, str]) -> None:
        super().__init__(scope, id)
        p = pool.gcp
        assert p is not None  # a gcp stack: the pool has a gcp placement
        short = naming.short(name, 52)
        bes = google("compute_region_backend_service")
        # Cookie affinity takes effect only under a hash policy (the provider's
        # locality_lb_policy docs: not MAGLEV or RING_HASH, "session affinity settings will
        # not take effect"): sticky trades LEAST_REQUEST for RING_HASH on the cookie.
        sticky = pool.serving.balancer == "sticky"
        self.backend = bes.ComputeRegionBackendService(
            self, "backend", name=f"{short}-backend", project=p.project, region=p.region,
            load_balancing_scheme="INTERNAL_MANAGED", protocol="HTTP", port_name="http",
            timeout_sec=600, connection_draining_timeout_sec=120,
            locality_lb_policy="RING_HASH" if sticky else "LEAST_REQUEST",
            session_affinity="GENERATED_COOKIE" if sticky else "NONE",
            affinity_cookie_ttl_sec=STICKY_COOKIE_S if sticky else None,
            health_checks=[nodes.lb_check.id],
            # CPU utilization says nothing about a GPU node's load: the ceiling at 1.0 keeps
            # it from steering traffic; LEAST_REQUEST does the balancing.
            backend=[bes.ComputeRegionBackendServiceBackend(
                group=nodes.mig.instance_group, balancing_mode="UTILIZATION",
                max_utilization=1.0, capacity_scaler=1.0,
            )],
            log_config={"enable": True, "sample_rate": 1.0},
        )
        self.url_map = google("compute_region_url_map").ComputeRegionUrlMap(
            self, "url-map", name=f"{short}-urlmap", project=p.project, region=p.region,
            default_service=self.backend.id,
        )
        if p.certificate:
            # HTTPS only, on 443, TLS 1.2 or later. No port-80 redirect: a second rule on the
            # same address needs a reserved shared VIP; clients are configured, not browsers.
            policy = google("compute_region_ssl_policy").ComputeRegionSslPolicy(
                self, "tls", name=f"{short}-tls", project=p.project, region=p.region,
                profile="MODERN", min_tls_version="TLS_1_2",
            )
            self.port = HTTPS_PORT
            self.proxy = google(
                "compute_region_target_https_proxy").ComputeRegionTargetHttpsProxy(
                self, "proxy", name=f"{short}-proxy", project=p.project, region=p.region,
                url_map=self.url_map.id, ssl_policy=policy.id,
                ssl_certificates=[certificate_link(p.certificate, p.project, p.region)],
            )
        else:
            self.port = LB_PORT
            self.proxy = google(
                "compute_region_target_http_proxy").ComputeRegionTargetHttpProxy(
                self, "proxy", name=f"{short}-proxy", project=p.project, region=p.region,
                url_map=self.url_map.id,
            )
        self.rule = google("compute_forwarding_rule").ComputeForwardingRule(
            self, "rule", name=f"{short}-rule", project=p.project, region=p.region,
            load_balancing_scheme="INTERNAL_MANAGED", ip_protocol="TCP",
            port_range=str(self.port), target=self.proxy.id, network=net.network,
            subnetwork=net.subnetwork, network_tier="PREMIUM", allow_global_access=False,
            labels=labels,
        )
