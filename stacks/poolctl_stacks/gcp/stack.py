"""One GCP pool stack: node identity, firewall, instance template and regional MIG with a
standby pool, internal load balancer, queue autoscaler.

Prerequisites in the placement's project (see network.py): a subnetwork with Private Google
Access, a proxy-only subnet in the region, Cloud NAT for registries outside Google, and
uniform bucket-level access on the weights bucket.
"""

from __future__ import annotations

from cdktn import GcsBackend

from poolctl import naming
from poolctl.bootscript import render_boot_script
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool
from poolctl.sizing import PoolPlan, instance_row
from poolctl_stacks._providers import google
from poolctl_stacks.base import PoolStack
from poolctl_stacks.gcp.iam import NodeServiceAccount
from poolctl_stacks.gcp.monitoring import SloPolicies
from poolctl_stacks.gcp.network import Network
from poolctl_stacks.gcp.pool import LoadBalancer, NodeGroup
from poolctl_stacks.gcp.scaling import QueueAutoscaler


class GcpPoolStack(PoolStack):
    cloud = Cloud.gcp

    def build(self, cfg: Config, pool: Pool, user_data: str, plan: PoolPlan) -> None:
        placement = pool.gcp
        assert placement is not None  # built for a pool's gcp placement only (Config.targets)
        row = instance_row(pool, Cloud.gcp)
        name = naming.base(cfg, pool)
        labels = naming.gcp_labels(cfg, pool)
        node_tag = f"{naming.short(name, 58)}-node"

        provider = google("provider").GoogleProvider(
            self, "google", project=placement.project, region=placement.region,
        )
        # Set through an override: cdktf rewrites the keys of the provider's default_labels
        # map to snake_case (poolctl_pool), which would break the contract's label names.
        provider.add_override("default_labels", labels)
        if b := self.raw_cfg.backend.gcp:  # backend settings are literal-only: raw values
            GcsBackend(self, bucket=b.bucket, prefix=f"{b.prefix}/{self.node.id}")
        else:
            self.local_backend()

        sa = NodeServiceAccount(self, "iam", name=name, project=placement.project,
                                weights=placement.weights,
                                api_key_secret=pool.api_key_secret(Cloud.gcp),
                                compile_cache=placement.compile_cache)
        net = Network(self, "network", placement=placement, name=name,
                      port=pool.serving.port, node_tag=node_tag)
        nodes = NodeGroup(self, "nodes", pool=pool, row=row, plan=plan, name=name, net=net,
                          node_tag=node_tag, sa_email=sa.sa.email, user_data=user_data,
                          image_user_data=render_boot_script(self.raw_cfg, self.raw_pool, Cloud.gcp,
                                                             from_image=True),
                          labels=labels)
        lb = LoadBalancer(self, "lb", pool=pool, name=name, net=net, nodes=nodes,
                          labels=labels)
        scaling = QueueAutoscaler(self, "scaling", pool=pool, plan=plan, name=name,
                                  nodes=nodes)
        SloPolicies(self, "monitoring", pool=pool, mig=naming.short(name, 63), labels=labels)

        self.output("instance_group_manager_name", nodes.mig.name, "The pool's regional MIG")
        self.output("instance_group_manager_self_link", nodes.mig.self_link,
                    "Self link of the regional MIG")
        self.output("instance_template_self_link", nodes.template.self_link,
                    "Instance template the MIG rolls to")
        self.output("forwarding_rule_ip_address", lb.rule.ip_address,
                    "Internal endpoint of the pool (HTTPS on 443 with gcp.certificate, "
                    "else HTTP on 80)")
        self.output("backend_service_self_link", lb.backend.self_link,
                    "Backend service of the nodes")
        self.output("service_account_email", sa.sa.email, "Identity of the nodes")
        self.output("autoscaler_name", scaling.autoscaler.name, "Queue autoscaler of the MIG")
