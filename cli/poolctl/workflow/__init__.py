"""Workflows: one module owns one workflow from start to end (`deploy`: a deploy or a
destroy; `rollout`: a rollout's start or its rollback), on the floor above the runtime and
below the commands, which parse flags, drive the steps, ask and render."""
