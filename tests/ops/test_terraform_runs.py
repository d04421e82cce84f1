"""poolctl.terraform.Terraform with the real Terraform CLI on a local configuration (the
builtin `terraform_data`, no provider to install, no cloud): its output goes to a private
log, the screen gets only errors (all of it with verbose), and `init` runs again only when
what it depends on changed."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from poolctl.errors import OperationFailed
from poolctl.terraform import Terraform

pytestmark = pytest.mark.skipif(
    not (os.environ.get("POOLCTL_TERRAFORM") or shutil.which("terraform")
         or shutil.which("tofu")), reason="no terraform/tofu on PATH")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("POOLCTL_PROVIDER_MIRROR", raising=False)
    monkeypatch.delenv("TF_CLI_CONFIG_FILE", raising=False)
    work = tmp_path / "stack"
    work.mkdir()
    (work / "main.tf.json").write_text(json.dumps({
        "terraform": {"required_version": ">= 1.6"},
        "resource": {"terraform_data": {"x": {"input": "v1"}}}}))
    return work


def test_output_goes_to_a_private_log_and_init_runs_once(workdir, capsys):
    tf = Terraform(workdir, label="probe")
    assert tf.init() is True
    summary = tf.plan()
    assert summary.to_json() == {"terraform_data": {"add": 1, "change": 0, "destroy": 0}}
    log = tf.log.read_text()
    assert tf.log.parent.name == "probe" and tf.log.stat().st_mode & 0o777 == 0o600
    assert "Initializing" in log and "Plan: 1 to add, 0 to change, 0 to destroy." in log
    assert "Plan:" not in capsys.readouterr().err  # off the screen

    again = Terraform(workdir, label="probe")
    assert again.init_current() and again.init() is False  # nothing init depends on changed
    again.verbose = True
    again.plan()
    err = capsys.readouterr().err
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in err  # --verbose shows it
    assert "Initializing" not in again.log.read_text()

    # what init depends on (here the terraform block) changed: it runs again
    (workdir / "main.tf.json").write_text(json.dumps({
        "terraform": {"required_version": ">= 1.5"},
        "resource": {"terraform_data": {"x": {"input": "v1"}}}}))
    third = Terraform(workdir, label="probe")
    assert not third.init_current() and third.init() is True


def test_a_failure_shows_terraforms_error_block_and_the_log(workdir, capsys):
    (workdir / "main.tf.json").write_text(json.dumps({
        "resource": {"terraform_data": {"x": {"input": '${file("nope")}'}}}}))
    tf = Terraform(workdir, label="broken")
    tf.init()
    with pytest.raises(OperationFailed) as e:
        tf.plan()
    assert str(e.value).endswith(f"; its error is above; the whole log: {tf.log}")
    err = capsys.readouterr().err
    assert err.startswith("Error: Invalid function argument\n")
    assert 'no file exists at "nope"' in err
    assert "Error: Invalid function argument" in tf.log.read_text()


def _with_provisioner(workdir, command: str) -> None:
    (workdir / "main.tf.json").write_text(json.dumps({
        "terraform": {"required_version": ">= 1.6"},
        "resource": {"terraform_data": {"x": {
            "input": "v1", "provisioner": [{"local-exec": {"command": command}}]}}}}))


def test_progress_and_the_summary_come_from_the_json_stream(workdir, capsys):
    """-json: each resource finished is a progress line (apply_complete), the summary its
    change_summary, the log the messages (no attribute values)."""
    _with_provisioner(workdir, "true")
    tf = Terraform(workdir, label="stream")
    tf.init()
    tf.plan()
    tf.apply()
    err = capsys.readouterr().err
    assert re.search(r"^stream: apply 1/1: terraform_data\.x created \(\d+ s\)$", err, re.M), err
    log = tf.log.read_text()
    assert "Apply complete! Resources: 1 added, 0 changed, 0 destroyed." in log
    assert "terraform_data.x: Creation complete" in log
    assert '"@message"' not in log  # the messages, not their JSON
    assert '"v1"' not in log  # no attribute value


def test_an_apply_error_is_read_from_the_stream_with_its_resource(workdir, capsys):
    _with_provisioner(workdir, "echo disk full >&2; exit 3")
    tf = Terraform(workdir, label="fails")
    tf.init()
    tf.plan()
    with pytest.raises(OperationFailed) as e:
        tf.apply()
    assert "`terraform apply` failed" in str(e.value) or "`tofu apply` failed" in str(e.value)
    err = capsys.readouterr().err
    # the diagnostic as Terraform shows it: summary, the resource, the detail
    assert re.search(r"^Error: local-exec provisioner error\n  with terraform_data\.x\n", err,
                     re.M), err
    assert "exit status 3" in err
    assert "Error: local-exec provisioner error" in tf.log.read_text()
