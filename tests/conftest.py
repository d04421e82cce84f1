"""The suite's shared fixtures and hooks live in plugins, one concern each (tests/plugins/):

- sandbox: a sandbox server per session (`sandbox`, `sandbox_client`, `sandbox_reset`) and
  the real CLI against it (`run_poolctl`, `pool_cli`);
- deployed_pool: the example pool deployed to that sandbox (`deployed_pool`);
- order: the modules that deploy first (xdist gives each worker whole modules:
  `--dist loadscope` in scripts/test); `POOLCTL_TEST_ORDER=reverse` checks that tests stand
  alone;
- cpu_log: per-module CPU, with POOLCTL_TEST_CPU_LOG (scripts/bench/suite_cpu.py).
"""

import os

from poolctl.endpoints import NO_METADATA_ENV

# -------------------------------------------------------------------------------------
# No test can leave the machine. Set on import, before any plugin or SDK is imported
# (google-auth reads NO_GCE_CHECK once, at import) and inherited by every poolctl, Terraform
# and sandbox process a test starts: no SDK probes a metadata address, and a command run
# without --sandbox finds fake credentials and a loopback endpoint (port 9: refused at once),
# never a developer's profile or keys. tests/unit/test_offline_env.py checks it.
LOOPBACK = "http://127.0.0.1:9"
SUITE_ENV = {
    **NO_METADATA_ENV,
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_ENDPOINT_URL": LOOPBACK,  # boto3 and the AWS CLI; the sandbox's own wins
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "POOLCTL_GCE_ENDPOINT": LOOPBACK,  # plain http: called without credentials
    "CLOUDSDK_CONFIG": "/nonexistent/poolctl-tests/gcloud",  # no gcloud login found
    # An internal error a test provokes shows its traceback (tests/inproc.py fails on it).
    "POOLCTL_DEBUG": "1",
}
# Whatever would choose other credentials or endpoints than the above.
SUITE_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
               "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
               "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CREDENTIAL_EXPIRATION",
               "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_OAUTH_ACCESS_TOKEN",
               "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
os.environ.update(SUITE_ENV)
for _name in SUITE_UNSET:
    os.environ.pop(_name, None)

pytest_plugins = [
    # In this order: a plugin imports only those before it (pytest then rewrites its asserts).
    "tests.plugins.sandbox",
    "tests.plugins.order",
    "tests.plugins.deployed_pool",
    "tests.plugins.cpu_log",
]
