"""The ways a command fails on purpose; the CLI maps them to exit codes and one line each."""


class PoolctlError(Exception):
    exit_code = 1


class UsageError(PoolctlError):
    """Bad usage, a config that does not parse or match the schema, a missing prerequisite."""

    exit_code = 2


class OperationFailed(PoolctlError):
    """A rule or check failed, or a cloud / Terraform operation failed."""

    exit_code = 1


class NotConfirmed(OperationFailed):
    """The user answered no at a confirmation: nothing was applied."""
