"""A serving sandbox with one pool deployed, for the serving e2e modules: each module starts
its own (nothing shared between modules, so they run in any order or worker)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from poolctl.sandbox import manager
from poolctl.vllm_releases import releases
from tests.configs import pool_yaml
from tests.plugins.sandbox import boto3_client, run_poolctl, sandbox_admin
from tests.serving.standin import call

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
AZURE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "azure-llm-2023-conv.csv"
KEY = "sandbox-pool-key-1"
KEY_VAR = "POOLCTL_TEST_POOL_KEY"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180.0,
             every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def azure_trace(path: Path, rate: float, seconds: float, prompt: int, output: int) -> None:
    """An Azure-format trace: `rate` requests a second of fixed lengths for `seconds`."""
    t0 = datetime(2023, 11, 16, 18, 0, 0)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(int(rate * seconds)):
            t = t0 + timedelta(seconds=i / rate)
            f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{prompt},{output}\n")


def serving(url: str) -> Any:
    """The sandbox's serving report (/_poolctl/serving)."""
    return sandbox_admin(url, "GET", "/_poolctl/serving")


def wait_for_targets(url: str, nodes: int, timeout: float = 240) -> None:
    """Until `nodes` nodes are behind the sandbox's load balancers."""
    def there() -> bool:
        rep = serving(url)
        return sum(len(t) for lb in rep["load_balancers"]
                   for t in lb["Targets"].values()) == nodes
    wait_for(f"{nodes} nodes behind the load balancer", there, timeout=timeout)


def self_signed(home: Path) -> tuple[bytes, bytes]:
    """(certificate, key) PEM of a self-signed certificate for 127.0.0.1, a day long."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    start = datetime.now(UTC) - timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))


@contextmanager
def serving_pool(home: Path, speed: float, certificate: bool = False, serving_extra: str = "",
                 engine_slowdown: float = 1.0, aws_extra: str = "", **yaml: Any
                 ) -> Iterator[dict[str, Any]]:
    """`sandbox start --serve` in `home`, the test pool (`pool_yaml(**yaml)`, AWS only, an API
    key in Secrets Manager; `serving_extra`: more lines of its `serving:`) deployed; yields
    home, url (the sandbox), lb (the pool's loopback endpoint, once a node answers through
    it), cfg, secret (the API key's ARN) and with `certificate` cert (a self-signed one for
    127.0.0.1 imported into the sandbox's ACM and named by certificate_arn: HTTPS);
    `engine_slowdown`: the sandbox's engines step that many times slower than the model;
    `aws_extra`: more lines of its `aws:` placement. On exit
    the sandbox stops and no process it started may outlive it."""
    info = manager.start(port=0, home=home, parent_pid=os.getpid(), serve_speed=speed,
                         engine_slowdown=engine_slowdown)
    url = str(info.endpoint)
    arn = boto3_client(url, "secretsmanager").create_secret(
        Name="chat-70b-key", SecretString=KEY)["ARN"]
    extra_aws, cert_file = aws_extra, None
    if certificate:
        pem, key = self_signed(home)
        cert_file = home / "cert.pem"
        cert_file.write_bytes(pem)
        cert_arn = boto3_client(url, "acm").import_certificate(
            Certificate=pem, PrivateKey=key)["CertificateArn"]
        extra_aws += f"      certificate_arn: {cert_arn}\n"
    cfg = home / "poolctl.yaml"
    # the default image's vLLM: its engines take poolctl's TPOT edges (--custom-histogram-buckets)
    text = pool_yaml(with_gcp=False, extra_aws=extra_aws, **yaml).replace(
        "image: vllm/vllm-openai:v0.11.0", f"image: {releases().default_image}")
    cfg.write_text(text.replace("      port: 8000\n",
                                f"      port: 8000\n      api_key_secret: {arn}\n"
                                f"{serving_extra}"))
    try:
        r = run_poolctl(home, "deploy", "--sandbox", "--auto-approve", "-f", str(cfg),
                        "--cloud", "aws", "--out", str(home / "cdktf.out"))
        assert r.returncode == 0, r.stderr[-3000:]

        def ready() -> str | None:
            lbs = [lb for lb in serving(url)["load_balancers"] if lb["Running"]]
            if not lbs or not any(lbs[0]["Targets"].values()):
                return None
            ok = call(lbs[0]["Endpoint"], "/v1/models", key=KEY, ca=cert_file)[0] == 200
            return str(lbs[0]["Endpoint"]) if ok else None

        lb = wait_for("a node serving behind the load balancer", ready)
        yield {"home": home, "url": url, "lb": lb, "cfg": cfg, "secret": arn, "cert": cert_file}
    finally:
        manager.stop(home=home)
        left = subprocess.run(["pgrep", "-af", str(home)], capture_output=True, text=True)
        assert left.stdout.strip() == "", left.stdout
