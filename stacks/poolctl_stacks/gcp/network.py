"""The pool's place in an existing VPC, and the firewall around its nodes.

poolctl does not create GCP networks. It expects, in the placement's network and region:
- a subnetwork with Private Google Access (nodes have no external IP, weights come from GCS);
- a proxy-only subnet (purpose REGIONAL_MANAGED_PROXY) for the internal Application Load
  Balancer. A region holds one active proxy-only subnet per VPC, shared by every pool there,
  so a pool stack that created its own would collide with the next pool's;
- Cloud NAT, if the serving image comes from a registry outside Google (Docker Hub).
Both subnets are looked up at plan time; a missing one stops the plan with a precondition
message naming the gcloud command that creates it.
"""

from __future__ import annotations

from cdktn import Precondition, TerraformResourceLifecycle, Token
from constructs import Construct

from poolctl import naming
from poolctl.config import GcpPlacement
from poolctl_stacks._providers import google
from poolctl_stacks.literal import hcl_quoted

# Google's health-check probers (documented source ranges for load balancer and MIG
# autohealing probes).
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
# Where Identity-Aware Proxy's TCP forwarding connects from (documented range):
# `gcp.node_access: iap` opens SSH to the nodes from it and nowhere else.
IAP_TCP_RANGE = "35.235.240.0/20"
# INTERNAL_HTTPS_LOAD_BALANCER is the older name of the same purpose; both are proxy-only.
PROXY_ONLY_FILTER = "purpose eq (REGIONAL_MANAGED_PROXY|INTERNAL_HTTPS_LOAD_BALANCER)"

# The config model admits only these shapes (poolctl.config GcpNetwork / GcpSubnetwork, a
# subnetwork in the placement's region): the parsers below read them and check nothing, so a
# file that passes `validate` synthesizes.


def _after(path: str, segment: str) -> str:
    parts = path.split("/")
    return parts[parts.index(segment) + 1]


def network_ref(p: GcpPlacement) -> tuple[str, str]:
    """(project, name) of the VPC: the placement's project, or a Shared VPC host given as
    projects/HOST/global/networks/NAME."""
    if "/" not in p.network:
        return p.project, p.network
    return _after(p.network, "projects"), _after(p.network, "networks")


def subnet_ref(p: GcpPlacement) -> tuple[str, str, str]:
    """(project, region, name) of the nodes' subnetwork. Without `subnetwork`, the network is
    taken to be auto mode (like `default`), whose subnet in each region bears its name."""
    net_project, net_name = network_ref(p)
    if not p.subnetwork:
        return net_project, p.region, net_name
    if "/" not in p.subnetwork:
        return net_project, p.region, p.subnetwork
    sub = p.subnetwork
    return _after(sub, "projects"), _after(sub, "regions"), _after(sub, "subnetworks")


class Network(Construct):
    def __init__(self, scope: Construct, id: str, *, placement: GcpPlacement,
                 name: str, port: int, node_tag: str) -> None:
        super().__init__(scope, id)
        p = placement
        net_project, net_name = network_ref(p)
        sub_project, region, sub_name = subnet_ref(p)
        # Firewall rules live with the VPC (the Shared VPC host, if any).
        self.network = f"projects/{net_project}/global/networks/{net_name}"
        self.subnetwork = f"projects/{sub_project}/regions/{region}/subnetworks/{sub_name}"
        self.subnet = google("data_google_compute_subnetwork").DataGoogleComputeSubnetwork(
            self, "subnet", project=sub_project, region=region, name=sub_name,
        )
        self.pga_precondition = Precondition(
            condition=f"${{data.google_compute_subnetwork.{self.subnet.friendly_unique_id}"
                      ".private_ip_google_access}",
            error_message=(
                f"gcp.subnetwork: {self.subnetwork} has Private Google Access off, so nodes "
                "without external IPs cannot reach GCS; run `gcloud compute networks subnets "
                f"update {sub_name} --project {sub_project} --region {region} "
                "--enable-private-ip-google-access`"
            ),
        )

        proxies = google("data_google_compute_subnetworks").DataGoogleComputeSubnetworks(
            self, "proxy_only", project=net_project, region=p.region,
            filter=PROXY_ONLY_FILTER,
        )
        # An expression, not a `locals` entry: checkov's terraform_json parser fails on
        # string-valued locals.
        proxy_cidrs = (
            f"[for s in data.google_compute_subnetworks.{proxies.friendly_unique_id}"
            f".subnetworks : s.ip_cidr_range if s.network_name == {hcl_quoted(net_name)}]"
        )

        fw = google("compute_firewall")
        fw_name = naming.short(name, 40)  # + the longest suffix stays within 63
        # Two rules rather than one with concat(): each is readable on its own, and the
        # proxies rule can refuse to exist with an empty source list, which GCP would read
        # as "from anywhere".
        self.fw_health = fw.ComputeFirewall(
            self, "allow-health-checks", name=f"{fw_name}-allow-health-checks",
            project=net_project, network=self.network, direction="INGRESS",
            priority=1000, source_ranges=list(HEALTH_CHECK_RANGES), target_tags=[node_tag],
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=[str(port)])],
            description="Google health-check probers to the serving port",
            log_config=fw.ComputeFirewallLogConfig(metadata="EXCLUDE_ALL_METADATA"),
        )
        self.fw_proxies = fw.ComputeFirewall(
            self, "allow-lb-proxies", name=f"{fw_name}-allow-lb-proxies",
            project=net_project, network=self.network, direction="INGRESS",
            priority=1000, source_ranges=Token.as_list(f"${{{proxy_cidrs}}}"),
            target_tags=[node_tag],
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=[str(port)])],
            description="Internal load balancer proxies (proxy-only subnet) to the serving port",
            log_config=fw.ComputeFirewallLogConfig(metadata="EXCLUDE_ALL_METADATA"),
            lifecycle=TerraformResourceLifecycle(precondition=[Precondition(
                condition=f"${{length({proxy_cidrs}) > 0}}",
                error_message=(
                    f"gcp.network: {net_name} has no proxy-only subnet in {p.region}; create "
                    "one (shared by every pool there): `gcloud compute networks subnets create "
                    f"{net_name}-proxy-only --network {net_name} --region {p.region} "
                    "--purpose REGIONAL_MANAGED_PROXY --role ACTIVE --range CIDR` "
                    "(an unused /23)"
                ),
            )]),
        )
        if p.node_access == "iap":
            # SSH for `poolctl nodes check --access iap`: only through IAP (which checks
            # the caller's IAM), and OS Login (on in the template) decides who logs in.
            self.fw_iap_ssh = fw.ComputeFirewall(
                self, "allow-iap-ssh", name=f"{fw_name}-allow-iap-ssh",
                project=net_project, network=self.network, direction="INGRESS",
                priority=1000, source_ranges=[IAP_TCP_RANGE], target_tags=[node_tag],
                allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=["22"])],
                description="SSH through Identity-Aware Proxy TCP forwarding only",
                # Who came in, and when: every SSH connection is logged with its metadata.
                log_config=fw.ComputeFirewallLogConfig(metadata="INCLUDE_ALL_METADATA"),
            )
        # Egress as on AWS: HTTPS out (GCS, Artifact Registry / Docker Hub, Google APIs);
        # the metadata server (DNS, token) is reachable regardless of firewall rules.
        fw.ComputeFirewall(
            self, "allow-https-out", name=f"{fw_name}-allow-https-out",
            project=net_project, network=self.network, direction="EGRESS",
            priority=1000, destination_ranges=["0.0.0.0/0"], target_tags=[node_tag],
            allow=[fw.ComputeFirewallAllow(protocol="tcp", ports=["443"])],
            description="Nodes to HTTPS endpoints only",
            log_config=fw.ComputeFirewallLogConfig(metadata="EXCLUDE_ALL_METADATA"),
        )
        fw.ComputeFirewall(
            self, "deny-other-out", name=f"{fw_name}-deny-other-out",
            project=net_project, network=self.network, direction="EGRESS",
            priority=65000, destination_ranges=["0.0.0.0/0"], target_tags=[node_tag],
            deny=[fw.ComputeFirewallDeny(protocol="all")],
            description="Everything else out of the nodes",
            log_config=fw.ComputeFirewallLogConfig(metadata="EXCLUDE_ALL_METADATA"),
        )
