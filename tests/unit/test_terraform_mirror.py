"""The CLI config poolctl writes for an offline provider mirror."""

from __future__ import annotations

import pytest

from poolctl.errors import UsageError
from poolctl.terraform import cli_config


def test_mirror_serves_only_the_providers_it_holds(tmp_path, monkeypatch):
    # A mirror with aws alone (as on the development machines) must leave google to the
    # registry: claiming every registry.terraform.io provider made `init` fail for GCP.
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "m" / "registry.terraform.io" / "hashicorp" / "aws" / "5.100.0").mkdir(
        parents=True)
    text = cli_config(str(tmp_path / "m")).read_text()
    assert 'include = ["registry.terraform.io/hashicorp/aws"]' in text
    assert 'exclude = ["registry.terraform.io/hashicorp/aws"]' in text
    assert "google" not in text and "/*/*" not in text


def test_empty_mirror_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "m").mkdir()
    with pytest.raises(UsageError, match="--provider-mirror: .* holds no providers"):
        cli_config(str(tmp_path / "m"))
