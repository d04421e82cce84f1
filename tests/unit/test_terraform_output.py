"""What poolctl makes of Terraform's output: the plan summary (from `show -json`), the boot
script left out of the log and the screen, the `Error:` blocks shown on a failure, the
progress lines off a terminal, and the private log files."""

from __future__ import annotations

import io
import json
import os
import re

from poolctl.progress import Progress
from poolctl.terraform import (
    BOOT_HIDDEN,
    LOG_KEEP,
    Redactor,
    ResourceChange,
    SizeChange,
    diagnostic_of,
    error_blocks,
    log_lines,
    log_path,
    summarize,
    ui_message,
)


def _asg(actions, before, after):
    return {"address": "aws_autoscaling_group.nodes", "type": "aws_autoscaling_group",
            "change": {"actions": actions, "before": before, "after": after}}


def test_summary_counts_by_type_and_lists_the_size_changes():
    group = {"min_size": 1, "max_size": 6, "desired_capacity": 1, "user_data": "x",
             "warm_pool": [{"min_size": 2, "max_group_prepared_capacity": 3,
                            "pool_state": "Stopped"}]}
    grown = {**group, "warm_pool": [{"min_size": 3, "max_group_prepared_capacity": 4,
                                     "pool_state": "Stopped"}]}
    plan = {"resource_changes": [
        _asg(["update"], group, grown),
        {"address": "aws_lb.lb", "type": "aws_lb", "change": {"actions": ["no-op"]}},
        {"address": "aws_launch_template.lt", "type": "aws_launch_template",
         "change": {"actions": ["delete", "create"]}},
        {"address": "aws_iam_role.r", "type": "aws_iam_role",
         "change": {"actions": ["create"], "importing": {"id": "r"}}},
    ]}
    s = summarize(plan)
    assert s.to_json() == {
        "aws_autoscaling_group": {"add": 0, "change": 1, "destroy": 0},
        "aws_iam_role": {"add": 1, "change": 0, "destroy": 0},
        "aws_launch_template": {"add": 1, "change": 0, "destroy": 1},
    }
    assert s.totals() == (2, 1, 1) and dict(s.imports) == {"aws_iam_role": 1}
    # one entry per resource that changes, in Terraform's words; the no-op is none
    assert s.resources == [ResourceChange("aws_autoscaling_group.nodes", "update"),
                           ResourceChange("aws_launch_template.lt", "replace"),
                           ResourceChange("aws_iam_role.r", "create")]
    # only what changes; user_data is no size
    assert s.sizes == [
        SizeChange("aws_autoscaling_group.nodes", "warm_pool.min_size", 2, 3),
        SizeChange("aws_autoscaling_group.nodes", "warm_pool.max_group_prepared_capacity", 3, 4),
    ]
    # every size as the plan leaves it, changed or not (the cost per hour reads them)
    assert s.size_values == {"min_size": 1, "max_size": 6, "desired_capacity": 1,
                             "warm_pool.min_size": 3,
                             "warm_pool.max_group_prepared_capacity": 4,
                             "warm_pool.pool_state": "Stopped"}


def test_summary_of_a_destroy_and_of_a_gcp_autoscaler():
    gone = summarize({"resource_changes": [_asg(["delete"], {"min_size": 1, "max_size": 6,
                                                              "desired_capacity": 1}, None)]})
    assert [(c.field, c.before, c.after) for c in gone.sizes] == [
        ("min_size", 1, None), ("max_size", 6, None), ("desired_capacity", 1, None)]
    assert gone.size_values == {"min_size": 1, "max_size": 6, "desired_capacity": 1}  # as it was
    assert [c.to_json() for c in gone.resources] == [
        {"address": "aws_autoscaling_group.nodes", "action": "destroy"}]
    # adopted and otherwise unchanged: an import, and a change the plan holds
    adopted = summarize({"resource_changes": [{
        "address": "aws_sqs_queue.q", "type": "aws_sqs_queue",
        "change": {"actions": ["no-op"], "importing": {"id": "q"}}}]})
    assert adopted.resources == [ResourceChange("aws_sqs_queue.q", "import")]
    assert not adopted.empty
    gcp = summarize({"resource_changes": [{
        "address": "google_compute_region_autoscaler.a",
        "type": "google_compute_region_autoscaler",
        "change": {"actions": ["update"],
                   "before": {"autoscaling_policy": [{"min_replicas": 1, "max_replicas": 6}]},
                   "after": {"autoscaling_policy": [{"min_replicas": 2, "max_replicas": 6}]}}}]})
    assert gcp.sizes == [SizeChange("google_compute_region_autoscaler.a",
                                    "autoscaling_policy.min_replicas", 1, 2)]


def test_the_boot_script_never_reaches_the_log():
    r = Redactor()
    lines = [
        '      + user_data              = "IyEvYmluL2Jhc2gKc2V0IC1ldQ=="',
        '      ~ user_data = "IyEvYmluL2Jhc2g=" -> "IyEvYmluL3No"',
        '          + "startup-script" = <<-EOT',
        "                #!/bin/bash",
        "                echo secret-free but long",
        "            EOT",
        '      + name = "acme-chat-70b"',
    ]
    out = [x for x in (r(line) for line in lines) if x is not None]
    assert out == [
        f"      + user_data              = {BOOT_HIDDEN}",
        f"      ~ user_data = {BOOT_HIDDEN}",
        f'          + "startup-script" = {BOOT_HIDDEN}',
        '      + name = "acme-chat-70b"',
    ]


def test_error_blocks_keep_errors_and_drop_warnings():
    stderr = ["", "Warning: Deprecated attribute", "", "  it goes away", "",
              "Error: creating Launch Template: AlreadyExists", "",
              "  with aws_launch_template.lt,", "  on cdk.tf.json line 9", "", ""]
    assert error_blocks(stderr) == ["Error: creating Launch Template: AlreadyExists", "",
                                    "  with aws_launch_template.lt,", "  on cdk.tf.json line 9"]


def test_progress_off_a_terminal_is_one_line_per_change():
    out = io.StringIO()
    with Progress(out, live=False) as p:
        for state in ("1/2 warm", "1/2 warm", "2/2 warm"):
            p.update(state)
        p.update("creating aws_lb.lb", quiet=True)  # the live line only
        p.update("2/2 warm")
        p.note("i-1 warm after 3 s")
    lines = out.getvalue().splitlines()
    assert [ln.rsplit(" (", 1)[0] for ln in lines] == ["1/2 warm", "2/2 warm",
                                                       "i-1 warm after 3 s"]
    assert re.fullmatch(r"1/2 warm \(\d+ s\)", lines[0])


def test_logs_are_private_and_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "logs" / "acme-chat-70b-aws"
    folder.mkdir(parents=True)
    for i in range(LOG_KEEP + 5):
        (folder / f"20260101T0000{i:02d}Z-deploy-1.log").write_text("old")
    path = log_path("acme-chat-70b-aws", "deploy")
    assert path.parent == folder and not path.exists()
    assert len(list(folder.glob("*.log"))) == LOG_KEEP - 1  # and the new one makes LOG_KEEP
    assert "20260101T000000Z-deploy-1.log" not in os.listdir(folder)  # the oldest went
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "home" / "logs").stat().st_mode & 0o777 == 0o700


def test_progress_on_a_terminal_is_a_live_line_with_the_elapsed_time():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with Progress(out) as p:  # live: rich redraws it (4 times a second)
        p.update("chat-70b: 1/2 warm")
        p.note("chat-70b: i-1 warm after 3 s")
        p.update("chat-70b: 2/2 warm")
    text = out.getvalue()
    assert "\x1b[" in text and re.search(r"\d:\d\d:\d\d", text)  # redraws, elapsed column
    assert "chat-70b: i-1 warm after 3 s\n" in text  # above the live line
    # the live line goes; the last state stays, as off a terminal
    assert re.search(r"\x1b\[2Kchat-70b: 2/2 warm \(\d+ s\)\n$", text)


def test_json_stream_messages_diagnostics_and_stray_lines():
    """Terraform's machine-readable UI (one JSON message a line): a diagnostic is logged and
    shown as the human output shows it; any other message by its one-line @message; a line
    that is no message (a provider's stray text) stays a line."""
    diag = ui_message(json.dumps({
        "@level": "error", "@message": "Error: creating Launch Template", "type": "diagnostic",
        "diagnostic": {"severity": "error", "summary": "creating Launch Template",
                       "detail": "AlreadyExists: lt-1\nstatus code: 400",
                       "address": "aws_launch_template.lt"}}))
    assert diag is not None
    d = diagnostic_of(diag)
    assert d is not None and d.address == "aws_launch_template.lt"
    assert log_lines(diag) == ["Error: creating Launch Template", "  with aws_launch_template.lt",
                               "", "AlreadyExists: lt-1", "status code: 400"]
    done = ui_message('{"@message": "aws_lb.lb: Creation complete after 3s [id=arn]", '
                      '"type": "apply_complete", "hook": {"resource": {"addr": "aws_lb.lb"}, '
                      '"action": "create", "elapsed_seconds": 3}}')
    assert done is not None
    assert log_lines(done) == ["aws_lb.lb: Creation complete after 3s [id=arn]"]
    assert diagnostic_of(done) is None
    for stray in ("panic: runtime error", "{not json", '{"no": "type"}', "[1, 2]"):
        assert ui_message(stray) is None
