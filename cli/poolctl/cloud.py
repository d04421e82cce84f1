"""The clouds poolctl places pools on.

`Cloud` is what the library compares and passes; it is a `str` (StrEnum), so records, JSON
and Terraform see "aws" / "gcp". Strings become a `Cloud` once, where they come in (the
commands' `--cloud`, the file's placements). At the bottom of the layers: this module
imports nothing of poolctl, and every layer may import it.
"""

from __future__ import annotations

from enum import StrEnum


class Cloud(StrEnum):
    aws = "aws"
    gcp = "gcp"
