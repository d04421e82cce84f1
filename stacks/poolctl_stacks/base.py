"""What every pool stack shares: the Terraform block, the backend, names and tags."""

from __future__ import annotations

from typing import Any

from cdktn import LocalBackend, TerraformOutput, TerraformStack
from constructs import Construct

from poolctl.cloud import Cloud
from poolctl.config import Config, Pool
from poolctl.sizing import PoolPlan, plan_pool
from poolctl_stacks.literal import literal_view

# Version ranges admit the provider the machines mirror offline (aws 5.100), the lines the
# prebuilt bindings were generated from (CDK Terrain's: aws 6.69, google 8.7) and the line a
# deployed pool's lock file may hold (google 6.x, from CDKTF's bindings): stacks use only
# arguments every admitted line knows, and synthesize the same JSON from the old bindings
# and the new (docs/install.md). `hashicorp/...` (not the bare `aws`) so OpenTofu resolves
# the same provider (opentofu#2402).
PROVIDER_REQUIREMENTS = {
    "aws": {"source": "hashicorp/aws", "version": ">= 5.100.0, < 7.0.0"},
    # google 6.16 is the first with GA `standby_policy` / `target_stopped_size` on MIGs.
    "google": {"source": "hashicorp/google", "version": ">= 6.16.0, < 9.0.0"},
}
# The Terraform and OpenTofu releases the stacks are written for, as CDK Terrain's
# `targetVersions` context (npm semver ranges): it refuses a feature these lack at synth. 1.10
# brought the S3 backend's own lock file (`use_lockfile`), what an S3 backend without a
# DynamoDB table locks with; nothing else in the stacks needs more than 1.6. (Not as the
# JSON's `terraform.required_version`: checkov's terraform_json parser fails on that string.)
TARGET_VERSIONS = {"terraform": ">=1.10.0", "opentofu": ">=1.10.0"}
# poolctl's cloud name -> the Terraform provider's local name.
PROVIDER_NAMES = {Cloud.aws: "aws", Cloud.gcp: "google"}
# Lifetime of the session-affinity cookie (`serving.balancer: sticky`): a day, ALB's default
# and the longest GCP allows (affinity_cookie_ttl_sec).
STICKY_COOKIE_S = 86_400


class PoolStack(TerraformStack):
    """One pool on one cloud: its own state, so pools deploy and fail independently.

    Subclasses build in `build()`, which sees only the Terraform-literal view of the config
    (`poolctl_stacks.literal`): no construct can pass a config string to Terraform as an
    expression. `raw_cfg`/`raw_pool` are for Terraform's literal-only places (variable
    defaults, backend settings); `user_data` is the rendered script as is.
    """

    cloud: Cloud

    def __init__(self, scope: Construct, id: str, *, cfg: Config, pool: Pool,
                 user_data: str, plan: PoolPlan | None = None) -> None:
        super().__init__(scope, id)
        self.node.set_context("targetVersions", TARGET_VERSIONS)  # before any child
        self.raw_cfg, self.raw_pool = cfg, pool
        self.cfg, self.pool = literal_view(cfg), literal_view(pool)
        provider = PROVIDER_NAMES[self.cloud]
        self.add_override(
            f"terraform.required_providers.{provider}", PROVIDER_REQUIREMENTS[provider]
        )
        # The plan the caller computed (a deploy computes it once for every step); `cdktn
        # synth` computes it here. Either way the file's view: no local build record, so the
        # JSON is the same on every machine.
        self.build(self.cfg, self.pool, user_data,
                   plan if plan is not None else plan_pool(self.pool, self.cloud))

    def build(self, cfg: Config, pool: Pool, user_data: str, plan: PoolPlan) -> None:
        raise NotImplementedError

    def local_backend(self) -> None:
        LocalBackend(self, path="terraform.tfstate")

    def output(self, name: str, value: Any, description: str) -> None:
        TerraformOutput(self, name, value=value, description=description)
