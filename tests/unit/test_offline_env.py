"""No test can leave the machine (issue 23): the suite's environment (tests/conftest.py) keeps
the AWS and Google SDKs off the clouds' metadata addresses and gives every command run
without --sandbox fake credentials and a loopback endpoint; the sandbox passes the same
metadata settings to the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from poolctl.endpoints import NO_METADATA_ENV, AwsEndpoint, real_clouds
from tests.conftest import LOOPBACK, SUITE_ENV, SUITE_UNSET


def test_the_suite_environment_carries_them():
    assert {k: os.environ.get(k) for k in SUITE_ENV} == SUITE_ENV
    assert [k for k in SUITE_UNSET if k in os.environ] == []
    assert NO_METADATA_ENV == {
        "AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_ROOT": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9"}
    assert real_clouds().gce_url == LOOPBACK == "http://127.0.0.1:9"


def test_the_sdks_see_fake_credentials_loopback_and_no_metadata():
    """What botocore and google-auth make of that environment, in a fresh interpreter (as a
    poolctl child: google-auth reads NO_GCE_CHECK once, when it is imported)."""
    code = (
        "import boto3, botocore.utils\n"
        "import google.auth.compute_engine._metadata as md\n"
        "s = boto3.session.Session()\n"
        "c = s.get_credentials()\n"
        "ec2 = s.client('ec2', region_name='us-east-1')\n"
        "imds = botocore.utils.InstanceMetadataFetcher()\n"
        "print(c.access_key, c.method, ec2.meta.endpoint_url, imds._disabled,\n"
        "      md._NO_GCE_CHECK, md._GCE_METADATA_HOST, md._get_metadata_ip_root(False))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.split() == ["testing", "env", "http://127.0.0.1:9", "True", "True",
                                "127.0.0.1:9", "http://127.0.0.1:9"], r.stderr[-2000:]


def test_sandbox_children_get_no_metadata():
    """Terraform, Packer and the AWS CLI aimed at the sandbox."""
    env = AwsEndpoint("http://127.0.0.1:4600", "us-east-1").env()
    assert NO_METADATA_ENV.items() <= env.items()


class Started(Exception):
    pass


def test_the_sandbox_server_gets_no_metadata(monkeypatch, tmp_path):
    """The server's environment, even from a shell that sets none of them."""
    from poolctl.sandbox import manager

    for name in NO_METADATA_ENV:
        monkeypatch.delenv(name)
    seen = {}

    def popen(argv, **kw):
        seen.update(kw["env"])
        raise Started

    monkeypatch.setattr(manager.subprocess, "Popen", popen)
    with pytest.raises(Started):
        manager.start(port=0, home=tmp_path)
    assert NO_METADATA_ENV.items() <= seen.items()
