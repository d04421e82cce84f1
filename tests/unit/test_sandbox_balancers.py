"""The sandbox's load balancers (sandbox/extensions/balancers.py): what HAProxy's runtime API
refuses is sent again, not lost (a target registered while HAProxy was not yet listening
never served in a CI run)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from poolctl.sandbox.extensions import balancers as bal


def test_a_refused_runtime_command_is_sent_again_at_the_next_sync(monkeypatch, tmp_path):
    monkeypatch.setitem(bal._settings, "root", str(tmp_path))
    monkeypatch.setitem(bal._settings, "speed", 1.0)
    lb = SimpleNamespace(arn="arn:lb", name="lb", dns_name="lb.example")
    monkeypatch.setattr(bal, "_snapshot",
                        lambda: [(lb, {"arn:tg": object()}, [], {"arn:tg": {"i-1"}})])
    monkeypatch.setattr(bal, "_signature", lambda listeners, tgs: ("sig",))
    sent: list[tuple[str, ...]] = []

    def runtime(b, *cmds):
        sent.append(cmds)
        if len(sent) == 1:
            raise ConnectionRefusedError(111, "Connection refused")
        return ""

    monkeypatch.setattr(bal, "_runtime", runtime)
    with subprocess.Popen(["sleep", "30"]) as proc:  # stands for a running HAProxy
        be = bal.Backend("tg0", "arn:tg", 8000, 0.0)
        b = bal.Balancer("arn:lb", "lb", "lb.example", tmp_path, {}, {"arn:tg": be},
                         proc=proc, signature=("sig",))
        monkeypatch.setitem(bal.balancers, "arn:lb", b)
        try:
            bal.sync(lambda inst: "127.0.0.5")
            assert be.slots == {}  # refused: the target holds no slot yet
            bal.sync(lambda inst: "127.0.0.5")
        finally:
            proc.kill()
    assert sent == [("set server tg0/s1 addr 127.0.0.5 port 8000",
                     "set server tg0/s1 state ready")] * 2
    assert be.slots == {"i-1": "s1"}
