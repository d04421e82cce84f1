"""The clouds poolctl places pools on, and (in the modules below) their runtime operations.

`Cloud` is what the library compares and passes; it is a `str` (StrEnum), so records, JSON
and Terraform see "aws" / "gcp". Importing this package loads no cloud SDK.
"""

from __future__ import annotations

from enum import StrEnum


class Cloud(StrEnum):
    aws = "aws"
    gcp = "gcp"
