"""poolctl.clouds.aws.preflight's certificate check, every answer ACM gives, through botocore's
Stubber (no endpoint is reached: a stubbed client answers from its queue). The sandbox
versions of these (moto's ACM, a deployed pool) are in tests/e2e/test_certificate.py."""

from __future__ import annotations

import pytest

from poolctl.cloud import Cloud
from poolctl.clouds.aws import preflight as aws_preflight
from poolctl.endpoints import AwsEndpoint, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError

KEY = "pools[0].aws.certificate_arn"
ARN = "arn:aws:acm:us-east-1:111122223333:certificate/0f7c2c1e-5d3b-4b8e-9d0e-2b6f6c1d9a01"
# Nothing listens there: a call the stub does not answer fails, never leaves the machine.
NOWHERE = CloudEndpoints(flag="--sandbox", clouds=frozenset({Cloud.aws}), aws=AwsEndpoint(
    "http://127.0.0.1:9", "us-east-1", {"aws_access_key_id": "testing",
                                        "aws_secret_access_key": "testing"}))


OPS: list = []  # the ops whose ACM client the fixture stubs


@pytest.fixture
def acm(monkeypatch):
    """The ACM client the check uses, stubbed; yields the Stubber to queue answers on."""
    from botocore.stub import Stubber

    from poolctl.clouds.aws.ops import make_ops

    ops = make_ops(NOWHERE)
    stub = Stubber(ops.client("acm", "us-east-1"))
    OPS[:] = [ops]
    with stub:
        yield stub
    stub.assert_no_pending_responses()


def _status(acm, status: str) -> None:
    acm.add_response("describe_certificate", {"Certificate": {
        "CertificateArn": ARN, "Status": status}}, {"CertificateArn": ARN})


def _check() -> str | None:
    return aws_preflight.check_certificate(KEY, ARN, "us-east-1", OPS[0])


def test_issued_certificate_passes(acm):
    _status(acm, "ISSUED")
    assert _check() is None


def test_missing_certificate(acm):
    acm.add_client_error("describe_certificate", "ResourceNotFoundException",
                         f"Could not find certificate {ARN}.")
    with pytest.raises(OperationFailed) as e:
        _check()
    assert str(e.value) == (
        f"{KEY}: no such certificate in us-east-1 ({ARN}); name one that `aws acm "
        "list-certificates --region us-east-1` lists, or remove the key for plain HTTP; "
        "nothing was applied")


@pytest.mark.parametrize(("status", "fix"), [
    ("PENDING_VALIDATION", "complete its validation (the DNS record `aws acm describe-"
                           "certificate` shows), then deploy again"),
    ("EXPIRED", "renew or re-import it, or name a current certificate"),
    ("REVOKED", "request or import a new certificate and name its ARN"),
    ("FAILED", "request or import a new certificate and name its ARN"),
])
def test_unissued_certificate(acm, status, fix):
    _status(acm, status)
    with pytest.raises(OperationFailed) as e:
        _check()
    assert str(e.value) == (f"{KEY}: the certificate is {status}, not ISSUED, so HTTPS cannot "
                            f"use it; {fix}; nothing was applied")


def test_another_regions_certificate_needs_no_call(acm):
    with pytest.raises(UsageError) as e:
        aws_preflight.check_certificate(KEY, ARN.replace("us-east-1", "eu-west-1"),
                                        "us-east-1", OPS[0])
    assert str(e.value).startswith(f"{KEY}: the certificate is in eu-west-1, the pool's load "
                                   "balancer in us-east-1;")


def test_denied_is_a_note_not_a_stop(acm):
    """The deployer may create listeners without reading ACM: the apply decides, and the
    stack keeps port 80 forwarding should it fail."""
    acm.add_client_error("describe_certificate", "AccessDeniedException", "not allowed")
    assert _check() == (f"{KEY}: not checked (acm:DescribeCertificate denied); should the "
                        "certificate be wrong, the apply stops at the HTTPS listener and port "
                        "80 keeps serving")


def test_other_errors_are_one_line(acm):
    acm.add_client_error("describe_certificate", "ThrottlingException", "slow down")
    with pytest.raises(OperationFailed, match=r"^aws acm DescribeCertificate in us-east-1: "
                       r"ThrottlingException: slow down \(still throttled"):
        _check()


def test_an_iam_certificate_is_left_to_elb(acm):
    assert aws_preflight.check_certificate(
        KEY, "arn:aws:iam::111122223333:server-certificate/pool", "us-east-1", OPS[0]) is None
