"""The HTTPS listener's certificate on a deployed pool (issue 23), with real Terraform against
the session's sandbox (its ACM is moto's: an imported certificate is ISSUED, a requested one
PENDING_VALIDATION for its first minute).

`aws.certificate_arn` naming a certificate that is missing, not issued or in another region
is refused before anything is synthesized or applied: the pool as it was, port 80
forwarding. And should the HTTPS listener fail anyway (the certificate deleted between the
check and the apply), port 80 keeps forwarding: the stack turns it into the redirect only
once the HTTPS listener exists.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.plugins.deployed_pool import DEPLOYED_EXAMPLE
from tests.plugins.sandbox import run_poolctl, terraform_missing

STACK = "acme-chat-70b-aws"
LB = "acme-chat-70b"
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account
KEY = "pools[0].aws.certificate_arn"

MISSING = terraform_missing()
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(MISSING is not None, reason=f"e2e deploy: {MISSING}")]


def _with_certificate(tmp_path: Path, arn: str) -> Path:
    f = tmp_path / "poolctl.yaml"
    text = DEPLOYED_EXAMPLE.read_text()
    anchor = "      instance_type: p5.48xlarge\n"
    assert anchor in text
    f.write_text(text.replace(anchor, f"{anchor}      certificate_arn: {arn}\n"))
    return f


def _pem() -> tuple[bytes, bytes]:
    """A self-signed certificate and its key, as ACM imports them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pool.acme.internal")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))


def _imported(acm) -> str:
    cert, key = _pem()
    arn: str = acm.import_certificate(Certificate=cert, PrivateKey=key)["CertificateArn"]
    assert acm.describe_certificate(CertificateArn=arn)["Certificate"]["Status"] == "ISSUED"
    return arn


def _listeners(elbv2) -> dict[int, dict]:
    [lb] = [x for x in elbv2.describe_load_balancers()["LoadBalancers"]
            if x["LoadBalancerName"] == LB]
    return {ls["Port"]: ls for ls in elbv2.describe_listeners(
        LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]}


def _forwarding(elbv2) -> None:
    """Port 80 alone, forwarding to the pool's target group: the pool as deployed."""
    listeners = _listeners(elbv2)
    assert sorted(listeners) == [80], listeners
    [action] = listeners[80]["DefaultActions"]
    assert action["Type"] == "forward" and action["TargetGroupArn"].split(":")[-1].startswith(
        f"targetgroup/{LB}/"), action


def _state(home: Path) -> bytes:
    return (home / "sandbox" / "state" / f"{STACK}.tfstate").read_bytes()


def _deploy(home: Path, f: Path, out: Path, timeout: float = 900):
    return run_poolctl(home, "deploy", "--cloud", "aws", "--sandbox", "--auto-approve", "-f",
                       str(f), "--out", str(out), timeout=timeout)


def _other_region(sandbox_client) -> tuple[str, int, str]:
    arn = _imported(sandbox_client("acm", "us-west-2"))
    # validate refuses it from the ARN alone (the config's shape check), before any call
    return arn, 2, (f"{KEY}: is in us-west-2, the pool in {REGION}; a load balancer takes a "
                    f"certificate of its own region: import or request one in {REGION}")


def _missing(sandbox_client) -> tuple[str, int, str]:
    arn = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/{uuid.uuid4()}"
    return arn, 1, (f"poolctl: {KEY}: no such certificate in {REGION} ({arn}); name one that "
                    f"`aws acm list-certificates --region {REGION}` lists, or remove the key "
                    "for plain HTTP; nothing was applied")


def _pending(sandbox_client) -> tuple[str, int, str]:
    acm = sandbox_client("acm")
    arn = acm.request_certificate(DomainName="pool.acme.example",
                                  ValidationMethod="DNS")["CertificateArn"]
    return arn, 1, (f"poolctl: {KEY}: the certificate is PENDING_VALIDATION, not ISSUED, so "
                    "HTTPS cannot use it; complete its validation (the DNS record `aws acm "
                    "describe-certificate` shows), then deploy again; nothing was applied")


@pytest.mark.parametrize("case", [_missing, _other_region, _pending],
                         ids=["missing", "other-region", "pending-validation"])
def test_a_certificate_https_cannot_use_is_refused_before_the_apply(
        case, deployed_pool, sandbox_home, sandbox_client, tmp_path):
    home = Path(sandbox_home)
    elbv2 = sandbox_client("elbv2")
    _forwarding(elbv2)
    state = _state(home)
    logs = set(home.glob(f"logs/{STACK}/*.log"))
    arn, code, line = case(sandbox_client)
    f = _with_certificate(tmp_path, arn)
    t0 = time.monotonic()
    res = _deploy(home, f, tmp_path / "cdktf.out", timeout=300)
    sys.stderr.write(f"\n[e2e timing] deploy refused ({arn.split(':')[3]}): "
                     f"{time.monotonic() - t0:.1f} s\n")
    assert res.returncode == code, res.stderr
    # One line, after validate's notes on the example (warnings and infos, not errors).
    notes = [ln for ln in res.stderr.splitlines() if not ln.startswith("poolctl:")]
    assert all(re.match(r"^\S+:\d+: (warning|info): \[", ln) for ln in notes), res.stderr
    refused = [ln for ln in res.stderr.splitlines() if ln.startswith("poolctl:")]
    assert len(refused) == 1 and line in refused[0], res.stderr
    # Nothing synthesized, no Terraform run, the pool and its state as they were.
    assert not (tmp_path / "cdktf.out").exists()
    assert set(home.glob(f"logs/{STACK}/*.log")) == logs
    assert _state(home) == state
    _forwarding(elbv2)


def test_a_failed_https_listener_leaves_port_80_forwarding(
        deployed_pool, sandbox_home, sandbox_client, tmp_path, monkeypatch):
    """The certificate passes the check, then is deleted before the apply (what no check
    can rule out): the HTTPS listener fails, and port 80 still forwards to the nodes."""
    from poolctl import deploy

    home = Path(sandbox_home)
    acm, elbv2 = sandbox_client("acm"), sandbox_client("elbv2")
    _forwarding(elbv2)
    arn = _imported(acm)
    overrides: list[Path] = []
    real = deploy.endpoint_workdir

    def workdir_then_lose_the_certificate(stack_dir, region, endpoints):
        work, env = real(stack_dir, region, endpoints)
        names = {v["protocol"]: k for k, v in json.loads(
            (work / "cdk.tf.json").read_text())["resource"]["aws_lb_listener"].items()}
        # The provider waits 5 minutes for a certificate to appear; the test, 10 s.
        override = work / "zz_test_listener_override.tf.json"
        override.write_text(json.dumps({"resource": {"aws_lb_listener": {
            names["HTTPS"]: {"timeouts": {"create": "10s"}}}}}))
        overrides.append(override)
        acm.delete_certificate(CertificateArn=arn)
        return work, env

    monkeypatch.setattr(deploy, "endpoint_workdir", workdir_then_lose_the_certificate)
    f = _with_certificate(tmp_path, arn)
    t0 = time.monotonic()
    try:
        res = _deploy(home, f, tmp_path / "cdktf.out")
    finally:
        for o in overrides:
            o.unlink(missing_ok=True)
    sys.stderr.write(f"\n[e2e timing] deploy with a failing HTTPS listener: "
                     f"{time.monotonic() - t0:.1f} s\n")
    assert overrides, res.stderr
    assert res.returncode == 1, res.stderr
    assert re.search(r"^poolctl: `terraform apply` failed", res.stderr, re.M), res.stderr
    assert "CertificateNotFound" in res.stderr
    _forwarding(elbv2)
    # The state agrees: port 80's listener unchanged, no HTTPS listener.
    resources = json.loads(_state(home))["resources"]
    listeners = [i["attributes"] for r in resources if r["type"] == "aws_lb_listener"
                 for i in r["instances"]]
    assert [(x["port"], x["default_action"][0]["type"]) for x in listeners] == [(80, "forward")]
