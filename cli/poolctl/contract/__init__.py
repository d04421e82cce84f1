"""What a cloud's pool stack and poolctl's runtime agree on: one module per cloud.

The stacks declare Terraform variables and rolling-update settings; the runtime passes
`TF_VAR_<name>` values and starts or steers updates with the same settings. Terraform
silently ignores a `TF_VAR_` no stack declares, so a name or a formula that lived on both
sides could drift apart unnoticed: each lives here once. These modules import neither cdktn
nor a cloud SDK (both sides load them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Var:
    """A Terraform variable of a pool stack (its logical id is `name`)."""

    name: str
    type: str  # Terraform type: "number" | "string"
    description: str

    @property
    def env(self) -> str:
        """The environment variable Terraform reads it from."""
        return f"TF_VAR_{self.name}"
