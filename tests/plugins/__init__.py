"""The suite's pytest plugins, loaded by tests/conftest.py (`pytest_plugins`), one concern each:

- sandbox: the session's sandbox server and the helpers that run the real CLI against it;
- deployed_pool: the example pool deployed to that sandbox, restored for each module;
- order: the modules that deploy first; each module's tests reversed on request;
- cpu_log: where the CPU goes, per module (only with POOLCTL_TEST_CPU_LOG);
- golden: the one golden-file check (a helper, no hooks).
"""
