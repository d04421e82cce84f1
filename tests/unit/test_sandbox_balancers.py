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


def test_the_serving_report_holds_while_the_serving_loop_adds_a_node(monkeypatch, tmp_path):
    """A CI run's warm test got a 500 from GET /_poolctl/serving: the report read boot logs
    over the live `nodes` dict while the serving loop added the new node. Here the "loop"
    adds a node (and a balancer slot) in the middle of the report's reads."""
    from poolctl.sandbox.extensions import serving_nodes as sn

    def node(inst: str) -> sn.Node:
        return sn.Node(inst, "us-east-1", "g", ("us-east-1", "p", "pool"), "127.0.0.9",
                       tmp_path / inst, "p5.48xlarge")

    monkeypatch.setattr(sn, "nodes", {"i-1": node("i-1")})
    be = bal.Backend("tg0", "arn:tg", 8000, 0.0, slots={"i-1": "s1"})
    b = bal.Balancer("arn:lb", "lb", "lb.example", tmp_path, {}, {"arn:tg": be})
    monkeypatch.setattr(bal, "balancers", {"arn:lb": b})

    def boot_log_read(instance_id: str) -> None:
        sn.nodes.setdefault("i-2", node("i-2"))
        return None

    def stats(balancer) -> dict:
        be.slots.setdefault("i-2", "s2")
        bal.balancers.setdefault("arn:lb2", bal.Balancer("arn:lb2", "lb2", "lb2.example",
                                                         tmp_path, {}, {}))
        return {}

    monkeypatch.setattr(sn, "failure_line", boot_log_read)
    monkeypatch.setattr(bal, "_health", stats)
    rep = sn.report()
    assert [n["InstanceId"] for n in rep["nodes"]] == ["i-1"]  # the node as it was read
    lbs = bal.report()
    assert [lb["LoadBalancerName"] for lb in lbs] == ["lb"]
    assert lbs[0]["Targets"] == {"tg0": ["i-1"]}
