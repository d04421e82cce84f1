"""The suite's pytest plugins, loaded by tests/conftest.py (`pytest_plugins`), one concern each:

- sandbox: the session's sandbox server and the helpers that run the real CLI against it;
- deployed_pool: the example pool deployed to that sandbox, handed from group to group;
- groups: how `--dist loadgroup` groups and orders the tests, and the guard on it;
- cpu_log: where the CPU goes, per group (only with POOLCTL_TEST_CPU_LOG);
- golden: the one golden-file check (a helper, no hooks).
"""
