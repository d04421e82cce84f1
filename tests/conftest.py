"""The suite's shared fixtures and hooks live in plugins, one concern each (tests/plugins/):

- sandbox: a sandbox server per session (`sandbox`, `sandbox_client`, `sandbox_reset`) and
  the real CLI against it (`run_poolctl`, `pool_cli`);
- deployed_pool: the example pool deployed to that sandbox (`deployed_pool`);
- groups: one xdist group per module under `--dist loadgroup` (scripts/test), deploying
  groups first, and the guard against pytest-xdist#1386;
- cpu_log: per-group CPU, with POOLCTL_TEST_CPU_LOG (scripts/bench/suite_cpu.py).
"""

pytest_plugins = [
    # In this order: a plugin imports only those before it (pytest then rewrites its asserts).
    "tests.plugins.sandbox",
    "tests.plugins.groups",
    "tests.plugins.deployed_pool",
    "tests.plugins.cpu_log",
]
