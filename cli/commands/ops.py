"""warm and status: runtime operations on a deployed pool."""

from __future__ import annotations


def warm() -> None:
    """Prepare N replicas of spare capacity before a launch."""


def status() -> None:
    """Nodes in service / warm / pending, rollout progress, queue."""
