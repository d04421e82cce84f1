"""What a pool's nodes need of the serving image's vLLM, as data (`data/vllm_releases.yaml`):
the flags the boot script passes and the metrics the node agent reads, each with the first
vLLM release that has it. `validate` warns on an image whose tag names an older release."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from poolctl import formats

Release = tuple[int, int, int]


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Need(_Row):
    name: str = Field(description="The flag (--x) or the metric as /metrics exposes it.")
    kind: Literal["flag", "metric"]
    only_when: Literal["prefix_caching_off"] | None = Field(
        default=None, description="The boot script passes the flag only then.")
    since: str = Field(description="The first vLLM release that has it.")
    absent_in: str = Field(description="The release before `since`, read without it.")
    source: str = Field(description="Where in the release's source it is.")

    @property
    def release(self) -> Release:
        return parse_release(self.since)


class Older(_Row):
    flags: list[str]
    metrics: list[str]


class Releases(_Row):
    default_image: str = Field(description="The image `init` and the examples use.")
    checked_from: str = Field(description="The oldest release read: `older` is in it.")
    needs: list[Need]
    offered: list[Need] = Field(description="Passed only to a release that has it.")
    older: Older

    def names(self) -> set[str]:
        """Every flag and metric the data accounts for."""
        return ({n.name for n in [*self.needs, *self.offered]} | set(self.older.flags)
                | set(self.older.metrics))


def parse_release(text: str) -> Release:
    major, minor, patch = (int(p) for p in text.split("."))
    return major, minor, patch


@cache
def releases() -> Releases:
    raw = yaml.safe_load(
        resources.files("poolctl.data").joinpath("vllm_releases.yaml").read_text())
    return Releases.model_validate(raw)


# vLLM's own images tag releases vX.Y.Z (vllm/vllm-openai:v0.34.0); mirrors and builds on top
# often drop the v or add a suffix (0.34.0, v0.34.0-cu129). A digest or a tag like `latest`
# or `prod` names no release: nothing is said of it.
_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(?:[-+_][\w.-]*)?$", re.ASCII)


def image_release(image: str) -> Release | None:
    """The vLLM release an image's tag names, if its repository is a vLLM one."""
    parts = formats.image_name_tag(image)
    if parts is None or parts[1] is None or "vllm" not in parts[0].rsplit("/", 1)[-1]:
        return None
    m = _TAG.match(parts[1])
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def offers(image: str, name: str) -> bool:
    """Whether the image's vLLM release has `name`, one of the data's `offered`."""
    [need] = [n for n in releases().offered if n.name == name]
    have = image_release(image)
    return have is not None and have >= need.release


CUSTOM_BUCKETS_FLAG = "--custom-histogram-buckets"


def fine_edges(image: str) -> bool:
    """Whether the image's engines take poolctl's TTFT and TPOT bucket edges (histograms.py)."""
    return offers(image, CUSTOM_BUCKETS_FLAG)


def lacking(image: str, prefix_caching: bool) -> list[Need]:
    """What the pool's nodes need that the image's release lacks, oldest need first."""
    have = image_release(image)
    if have is None:
        return []
    needs = [n for n in releases().needs
             if n.release > have and not (n.only_when == "prefix_caching_off" and prefix_caching)]
    return sorted(needs, key=lambda n: n.release)
