"""SSH to the nodes: paramiko with strict host keys (never trust on first use), one clear line
per way of failing, and the ways in: the caller's keys (`ssh`), a key pushed through EC2
Instance Connect and its endpoint's tunnel (`instance-connect`), a key imported into OS Login
and IAP's tunnel (`iap`).

paramiko, boto3 and the cryptography primitives load in the functions that connect, so
`poolctl --help` stays fast.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import logging
import re
import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from poolctl.cloud import Cloud
from poolctl.clouds.base import ImportsLoginKeys, SendsInstanceKeys
from poolctl.clouds.registry import get_ops
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import OperationFailed, UsageError
from poolctl.nodecheck.checks import CmdResult, Runner

if TYPE_CHECKING:  # paramiko loads in the functions that connect
    import paramiko

DEFAULT_USER = "ubuntu"
DEFAULT_PORT = 22
DEFAULT_TIMEOUT_S = 10.0
# How nodes are reached: `ssh` with the caller's keys, straight to the address (from inside
# the VPC, a VPN or a bastion); `instance-connect` (AWS): a key made for this check only,
# pushed with ec2-instance-connect:SendSSHPublicKey (valid 60 s), and SSH through the pool's
# EC2 Instance Connect Endpoint (the AWS CLI's WebSocket tunnel): no public port, no key pair.
# `iap` (GCP): a key made for this check only, imported into the caller's OS Login profile
# (expiring after OS_LOGIN_KEY_TTL_S, deleted once logged in), and SSH through Identity-Aware
# Proxy's TCP forwarding (gcloud's tunnel), logging in as the caller's OS Login POSIX user.
ACCESS_MODES = ("ssh", "instance-connect", "iap")
# The tunnels, run as SSH's ProxyCommand (stdin/stdout carry the SSH stream). %i: instance id
# (GCP: instance name), %h: address, %p: port, %r: region, %z: zone, %P: project;
# substituted into the split words, never through a shell.
TUNNEL_COMMAND = ("aws ec2-instance-connect open-tunnel --instance-id %i --remote-port %p "
                  "--region %r")
IAP_TUNNEL_COMMAND = ("gcloud compute start-iap-tunnel %i %p --listen-on-stdin --zone %z "
                      "--project %P")
DEFAULT_TUNNELS = {"instance-connect": TUNNEL_COMMAND, "iap": IAP_TUNNEL_COMMAND}
# Long enough for gcloud to open the tunnel and the node to ask OS Login for the key; the key
# is deleted as soon as the login is done, this bounds a key whose delete failed.
OS_LOGIN_KEY_TTL_S = 300


# ---------------------------------------------------------------------------------------
# Hosts.


@dataclass(frozen=True)
class Host:
    host: str
    port: int
    instance_id: str | None = None  # found by discovery (GCP: the instance name)
    region: str | None = None
    zone: str | None = None  # GCP
    project: str | None = None  # GCP

    @property
    def label(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH (and paramiko) name this host in known_hosts."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def parse_host(text: str, default_port: int = DEFAULT_PORT) -> Host:
    """`host`, `host:port`, `[v6]:port`, or a bare IPv6 address."""
    raw = text.strip()
    host, port_text = raw, None
    if raw.startswith("["):
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d*))?", raw)
        if not m:
            raise UsageError(f"--host {text}: write HOST, HOST:PORT or [IPv6]:PORT")
        host, port_text = m[1], m[2]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    if not host or any(c.isspace() for c in host) or host.startswith("-"):
        raise UsageError(f"--host {text!r}: not a host name or address; write HOST or HOST:PORT")
    port = default_port
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"--host {text}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return Host(host, port)


# ---------------------------------------------------------------------------------------
# SSH: strict host keys, one clear line per way of failing.


class SshOptions:
    """How to reach the nodes. Validated once, before any connection (bad input: exit 2)."""

    def __init__(self, user: str | None = None, identity: Path | None = None,
                 known_hosts: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 access: str = "ssh", proxy_command: str | None = None,
                 endpoints: CloudEndpoints = REAL_CLOUDS):
        if access not in ACCESS_MODES:
            raise UsageError(f"--access {access}: use one of {', '.join(ACCESS_MODES)}")
        if access == "iap" and user is not None:
            raise UsageError("--user: with --access iap poolctl logs in as your OS Login user "
                             "(from your login profile); drop --user")
        user = user if user is not None or access == "iap" else DEFAULT_USER
        if user is not None and (not user or any(c.isspace() for c in user)):
            raise UsageError(f"--user {user!r}: not a user name")
        if access == "instance-connect" and identity is not None:
            raise UsageError("--identity: instance-connect logs in with a key made and pushed "
                             "for each check; drop --identity or use --access ssh")
        if access == "iap" and identity is not None:
            raise UsageError("--identity: iap logs in with a key made and imported into OS "
                             "Login for each check; drop --identity or use --access ssh")
        if proxy_command is not None:
            try:
                if not shlex.split(proxy_command):
                    raise ValueError("empty")
            except ValueError as e:
                raise UsageError(f"--proxy-command: cannot split it into arguments ({e}); "
                                 "quote it as for a shell") from None
        elif endpoints.loopback_only and access in DEFAULT_TUNNELS:
            # The default tunnels talk to the cloud's endpoints: not from the sandbox.
            raise UsageError(f"--access {access} with {endpoints.flag} needs --proxy-command: the "
                             f"default tunnel ({DEFAULT_TUNNELS[access].split(' %')[0]}) would "
                             "leave this machine; give a local command reaching the node's sshd")
        self.access = access
        self.proxy_command = proxy_command or DEFAULT_TUNNELS.get(access)
        self.os_login: OsLogin | None = OsLogin() if access == "iap" else None
        self.endpoints = endpoints  # where key pushes and OS Login calls go
        if timeout <= 0:
            raise UsageError(f"--timeout {timeout}: give a number of seconds above 0")
        self.user = user
        self.timeout = timeout
        self.identity = identity
        self.pkey = load_identity(identity) if identity is not None else None
        self.known_hosts_explicit = known_hosts is not None
        self.known_hosts = (known_hosts or Path("~/.ssh/known_hosts")).expanduser()
        if self.known_hosts_explicit and not self.known_hosts.is_file():
            raise UsageError(
                f"--known-hosts {known_hosts}: no such file; pass your known_hosts file, or "
                "create one with `ssh-keyscan HOST >> FILE` after verifying the fingerprints"
            )


def load_identity(path: Path) -> Any:

    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--identity {path}: no such file; pass the private key the nodes "
                         "accept (e.g. ~/.ssh/id_ed25519)")
    try:
        return paramiko.PKey.from_path(p)
    except (paramiko.PasswordRequiredException, TypeError):
        # cryptography raises TypeError for an encrypted key loaded without a password.
        raise UsageError(f"--identity {path}: the key is passphrase-protected; load it into "
                         "ssh-agent (`ssh-add`) and omit --identity") from None
    except (paramiko.SSHException, ValueError, OSError) as e:
        raise UsageError(f"--identity {path}: not a private key paramiko can read ({e}); "
                         "pass an OpenSSH private key (not the .pub)") from None


def fingerprint(key: Any) -> str:
    """OpenSSH's form: SHA256:<base64 without padding> of the key blob."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class SshFailure(Exception):
    def __init__(self, observed: str, hint: str):
        super().__init__(observed)
        self.observed = observed
        self.hint = hint


@dataclass(frozen=True)
class KnownHost:
    """One line of a known_hosts file (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT")."""

    line: int
    marker: str | None  # "@cert-authority", "@revoked" or None
    patterns: str  # comma-separated host patterns (wildcards, !negation, |1| hashes)
    key_type: str
    key_b64: str


def read_known_hosts(path: Path) -> list[KnownHost]:
    """Every usable line; malformed ones are skipped, as OpenSSH skips them."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise SshFailure(f"cannot read {path}: {e.strerror or e}",
                         "fix or replace the known_hosts file") from None
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, "@cert-authority", "@revoked") or len(fields) < 3:
            continue
        out.append(KnownHost(n, marker, fields[0], fields[1], fields[2]))
    return out


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):  # hashed: HMAC-SHA1 of the name, keyed by the salt
        try:
            salt, digest = (base64.b64decode(p) for p in pattern[3:].split("|", 1))
        except (ValueError, TypeError):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), "sha1").digest(), digest)
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.I) is not None


def host_matches(patterns: str, name: str) -> bool:
    """OpenSSH's rule: some pattern matches and no negated (!) one does."""
    hit = False
    for p in patterns.split(","):
        if p.startswith("!"):
            if _pattern_matches(p[1:], name):
                return False
        elif _pattern_matches(p, name):
            hit = True
    return hit


def _pkey(entry: KnownHost) -> Any | None:

    try:
        return paramiko.PKey.from_type_string(entry.key_type, base64.b64decode(entry.key_b64))
    except Exception:  # a key type paramiko does not know, or a damaged line: unusable
        return None


class HostKeyPolicy:
    """What known_hosts says of the host, beyond the plain keys paramiko compares itself:
    keys revoked (`@revoked`, for any host) and certificate authorities (`@cert-authority`)."""

    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host = host
        self.path = known_hosts
        entries = read_known_hosts(known_hosts) if known_hosts.is_file() else []
        name = host.known_hosts_name
        self.revoked = {e.key_b64: e.line for e in entries if e.marker == "@revoked"}
        self.plain = [e for e in entries if e.marker is None and e.key_b64 not in self.revoked
                      and host_matches(e.patterns, name)]
        self.cas = [e for e in entries if e.marker == "@cert-authority"
                    and host_matches(e.patterns, name)]

    def load(self, client: Any) -> None:
        """The plain keys for this host (wildcards resolved) into paramiko's table, under
        the exact name paramiko looks up."""
        keys = client.get_host_keys()
        for e in self.plain:
            key = _pkey(e)
            if key is not None:
                keys.add(self.host.known_hosts_name, key.get_name(), key)

    def revoked_failure(self, key: Any) -> SshFailure | None:
        line = self.revoked.get(key.get_base64())
        if line is None:
            return None
        return SshFailure(
            f"host key {key.get_name()} {fingerprint(key)} of {self.host.known_hosts_name} is "
            f"REVOKED in {self.path} (line {line}); refused, nothing was run",
            "the key was revoked on purpose: replace the node (or its host key), then add the "
            "new key after verifying its fingerprint on the node")

    def missing(self, key: Any) -> SshFailure:
        revoked = self.revoked_failure(key)
        if revoked is not None:
            return revoked
        port = "" if self.host.port == 22 else f"-p {self.host.port} "
        add = f"ssh-keyscan {port}{self.host.host} >> {self.path}"
        if self.cas:
            return SshFailure(
                f"{self.host.known_hosts_name} is trusted through a @cert-authority line of "
                f"{self.path} (line {self.cas[0].line}), but poolctl's SSH client (paramiko) "
                f"cannot verify host certificates; the node's own key {key.get_name()} "
                f"{fingerprint(key)} is not listed; refused, nothing was run",
                f"verify that fingerprint on the node, then add its own host key: {add}")
        return SshFailure(
            f"unknown host key {key.get_name()} {fingerprint(key)} for "
            f"{self.host.known_hosts_name}: not in {self.path}; refused, nothing was run",
            f"verify that fingerprint on the node itself (console or "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_{_key_file(key)}_key.pub`), then add it: {add}",
        )


def _reject_policy(policy: HostKeyPolicy) -> paramiko.RejectPolicy:

    class Reject(paramiko.RejectPolicy):
        """RejectPolicy that says why the key was refused and how to trust it on purpose."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> NoReturn:
            raise policy.missing(key)

    return Reject()


def _key_file(key: Any) -> str:
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(
        name, "ecdsa" if name.startswith("ecdsa") else "*")


def _quiet_paramiko() -> None:
    # paramiko logs failed handshakes with tracebacks; without a handler Python's last-resort
    # handler would print them to stderr, next to the one line each failure already gets.
    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def connect(host: Host, opts: SshOptions) -> tuple[paramiko.SSHClient, str, str | None]:
    """(a connected paramiko SSHClient, the user logged in as, a note for the ssh check), or
    SshFailure with the reason and the fix."""

    _quiet_paramiko()
    client = paramiko.SSHClient()
    # Read here, not by paramiko: its parser stops at @cert-authority / @revoked lines and
    # takes wildcard patterns for literal names.
    policy = HostKeyPolicy(host, opts.known_hosts)
    policy.load(client)
    client.set_missing_host_key_policy(_reject_policy(policy))
    kwargs: dict[str, Any] = {}
    key_desc = f"key {opts.identity}" if opts.identity else "ssh-agent / ~/.ssh keys"
    pkey, user, forget = opts.pkey, opts.user, None
    auth_hint = ("check --user (DLAMI: ubuntu) and --identity, and that the key's public half "
                 "is in the user's ~/.ssh/authorized_keys on the node (the pool's key pair)")
    if opts.access == "instance-connect":
        pkey = push_instance_connect_key(host, opts)
        key_desc = "a key pushed by EC2 Instance Connect"
    elif opts.access == "iap":
        assert opts.os_login is not None  # SshOptions makes one for --access iap
        pkey, user, forget = opts.os_login.import_key(host)
        key_desc = "a key imported into your OS Login profile"
        auth_hint = ("OS Login refused you: you need roles/compute.osAdminLogin (or osLogin) "
                     "on the project, and the node `enable-oslogin` with its guest agent "
                     "running")
    assert user is not None  # SshOptions gives one for every access but iap, set just above
    if pkey is not None:
        # Only the key asked for: no agent, no ~/.ssh guesses, so a wrong key fails plainly.
        kwargs = {"pkey": pkey, "allow_agent": False, "look_for_keys": False}
    who = f"{user}@{host.label}"
    try:
        if opts.proxy_command:
            kwargs["sock"] = proxy_socket(opts.proxy_command, host)
        client.connect(host.host, port=host.port, username=user, timeout=opts.timeout,
                       banner_timeout=opts.timeout, auth_timeout=opts.timeout,
                       channel_timeout=opts.timeout, **kwargs)
    except SshFailure:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        revoked = policy.revoked_failure(e.key)
        if revoked is not None:
            raise revoked from None
        raise SshFailure(
            f"host key of {host.known_hosts_name} CHANGED: got {e.key.get_name()} "
            f"{fingerprint(e.key)}, {opts.known_hosts} has {fingerprint(e.expected_key)}; "
            "refused, nothing was run",
            "a replaced node gets a new key, but so does a man in the middle: verify the new "
            f"fingerprint on the node, then `ssh-keygen -R '{host.known_hosts_name}' -f "
            f"{opts.known_hosts}` and add the new key",
        ) from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise SshFailure(f"authentication failed for {who} with {key_desc} ({e})",
                         auth_hint) from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        client.close()
        raise SshFailure(
            f"connection refused by {host.label}",
            "sshd is not running there or the port is wrong (--port, or HOST:PORT)",
        ) from None
    except TimeoutError:
        client.close()
        raise SshFailure(
            f"no answer from {host.label} within {opts.timeout:g} s",
            "the node is unreachable from here (run from inside the VPC or through a bastion; "
            "nodes have no public address) or a security group / firewall drops port "
            f"{host.port}; raise --timeout for a slow link",
        ) from None
    except socket.gaierror as e:
        client.close()
        raise SshFailure(f"cannot resolve {host.host}: {e.strerror or e}",
                         "check the host name, or pass the node's IP address") from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        client.close()
        raise SshFailure(f"ssh to {host.label} failed: {e or type(e).__name__}",
                         "check that the port is an SSH server and the node is up") from None
    finally:
        # Logged in or not, the imported key has done its work.
        note = forget() if forget is not None else None
    return client, user, note


_PLACEHOLDER = re.compile(r"%[ihprzP%]")


def _placeholders(host: Host) -> dict[str, str | None]:
    return {"%i": host.instance_id, "%h": host.host, "%p": str(host.port), "%r": host.region,
            "%z": host.zone, "%P": host.project, "%%": "%"}


def proxy_argv(template: str, host: Host) -> list[str]:
    """The proxy command's words with %i %h %p %r %z %P replaced: each value stays one
    argument whatever it holds (no shell)."""
    values = _placeholders(host)
    return [_PLACEHOLDER.sub(lambda m: values[m[0]] or "", word)
            for word in shlex.split(template)]


def proxy_socket(template: str, host: Host) -> Any:

    argv = proxy_argv(template, host)
    values = _placeholders(host)
    missing = [p for p in sorted(set(_PLACEHOLDER.findall(template))) if not values[p]]
    if missing:
        raise SshFailure(f"the proxy command needs {' '.join(missing)} (instance, region, "
                         f"zone or project) of {host.label}, which only discovery knows",
                         "let poolctl find the nodes through the cloud (no --host)")
    try:
        return paramiko.ProxyCommand(shlex.join(argv))
    except paramiko.SSHException as e:  # the command cannot start
        raise SshFailure(f"proxy command `{argv[0]}` for {host.label} failed to start: {e}",
                         "install it (instance-connect: AWS CLI v2; iap: the gcloud CLI) or "
                         "fix --proxy-command") from None


def _fresh_key() -> Any:
    """A new ed25519 key for one login; the private half never leaves this process."""

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()).decode()
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


class OsLogin:
    """`--access iap`: one key per node login, imported into the caller's OS Login profile
    (users.importSshPublicKey, expiring after OS_LOGIN_KEY_TTL_S) and deleted after the
    login. The account is resolved once, before any connection (`prepare`)."""

    def __init__(self) -> None:
        self.ops: Any = None
        self.account: str | None = None

    def prepare(self, endpoints: CloudEndpoints = REAL_CLOUDS) -> str:
        if self.ops is None:
            ops = get_ops(Cloud.gcp, endpoints)
            assert isinstance(ops, ImportsLoginKeys)  # GCP's ops import OS Login keys
            self.account = ops.caller_account()
            self.ops = ops
        assert self.account is not None  # set with self.ops (caller_account gives a str)
        return self.account

    def import_key(self, host: Host) -> tuple[Any, str, Callable[[], str | None]]:
        """(key, POSIX user, forget): `forget()` deletes the key, returning a note when it
        could not."""
        if self.ops is None or not host.project:
            raise SshFailure(f"iap needs the instance and project of {host.label}",
                             "let poolctl find the nodes through the cloud (no --host), or "
                             "use --access ssh")
        key = _fresh_key()
        try:
            user, fp = self.ops.import_ssh_key(self.account, f"{key.get_name()} "
                                               f"{key.get_base64()} poolctl-nodes-check",
                                               host.project, OS_LOGIN_KEY_TTL_S)
        except OperationFailed as e:
            raise SshFailure(str(e), "the caller needs roles/compute.osAdminLogin (or "
                             "osLogin) and OS Login must be on in the project") from None

        def forget() -> str | None:
            try:
                self.ops.delete_ssh_key(self.account, fp)
            except OperationFailed as e:
                return f"the imported key was not deleted ({e}); it expires by itself"
            return None

        return key, user, forget


def push_instance_connect_key(host: Host, opts: SshOptions) -> Any:
    """A new ed25519 key, its public half pushed to the instance for `opts.user` through
    EC2 Instance Connect (the node's sshd accepts it for 60 s). The private half never leaves
    this process."""
    if not host.instance_id or not host.region:
        raise SshFailure(f"instance-connect needs the instance id of {host.label}",
                         "let poolctl find the nodes through the cloud (no --host), or use "
                         "--access ssh")
    assert opts.user is not None  # only iap leaves the user to OS Login
    key = _fresh_key()
    ops = get_ops(Cloud.aws, opts.endpoints)
    assert isinstance(ops, SendsInstanceKeys)  # AWS's ops push instance keys
    try:
        ops.send_instance_key(host.region, host.instance_id, opts.user,
                              f"{key.get_name()} {key.get_base64()}")
    except UsageError as e:
        raise SshFailure(str(e), "configure them (AWS_PROFILE, aws sso login ...)") from None
    except OperationFailed as e:
        raise SshFailure(str(e), "the caller needs ec2-instance-connect:SendSSHPublicKey on "
                         "the instance, and the node must be running") from None
    return key


def command_runner(client: paramiko.SSHClient, timeout: float) -> Runner:
    """Runs each command on its own channel of one connected client."""
    def run(cmd: str) -> CmdResult:
        """One command; once more on a new channel when the SSH channel itself failed (it
        would not open, dropped, or closed without an exit status: the link's trouble, not
        the node's answer). A timeout is not tried again: it would only double the wait."""
        res = run_once(cmd)
        if res.rc is None and not (res.error or "").endswith(f"did not finish in {timeout:g} s"):
            res = run_once(cmd)
        return res

    def run_once(cmd: str) -> CmdResult:
        tool = cmd.split()[0]
        chan = None
        try:
            _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
            chan = stdout.channel
            out = stdout.read().decode(errors="replace")
            err = stderr.read().decode(errors="replace")
            rc = chan.recv_exit_status()
        except TimeoutError:
            return CmdResult(None, error=f"`{tool}` did not finish in {timeout:g} s")
        except Exception as e:  # paramiko raises SSHException / EOFError on a dropped link
            return CmdResult(None, error=f"`{tool}` failed: {e or type(e).__name__}")
        finally:
            # sshd allows 10 sessions per connection (MaxSessions): free each one, hung or not.
            if chan is not None:
                chan.close()
        # -1: the server sent no exit status (the channel closed first).
        if rc < 0:
            return CmdResult(None, out, err, "no exit status")
        return CmdResult(rc, out, err)

    return run
