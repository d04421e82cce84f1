"""The one golden-file check (boot scripts, synthesized stacks): `assert_golden(path, text)`.

`text` must equal the file at `path`. With POOLCTL_UPDATE_GOLDEN=1 the file is first
(re)written from `text`, so the test passes and `git diff tests/golden` shows the change to
review. Any other value of the variable is refused: a typo must not leave files unwritten
while the run looks green.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

UPDATE = "POOLCTL_UPDATE_GOLDEN"


def assert_golden(path: Path, text: str) -> None:
    flag = os.environ.get(UPDATE, "")
    if flag not in ("", "1"):
        pytest.fail(f"{UPDATE}={flag}: set it to 1 to rewrite the golden files, or unset it",
                    pytrace=False)
    if flag == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with {UPDATE}=1 to create it, then review it"
    assert text == path.read_text(), (
        f"{path.name} differs from {path}; if the change is intended, regenerate it with "
        f"{UPDATE}=1 and review the diff")
