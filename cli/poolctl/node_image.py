"""Node images as facts: which image a placement boots and whether it carries the serving
image, from the file and from the build records `poolctl image build` leaves in
`$POOLCTL_HOME/images/<cloud>-<image>.json`.

At the bottom floor so that sizing can take a `NodeImage` from its caller (the stacks pass the
file's view, `plan` the recorded one) without importing the image builder above it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from poolctl.cloud import Cloud
from poolctl.config import AwsPlacement, Pool
from poolctl.home import poolctl_home, write_private

Source = Literal["build record", "serving.image_prepulled"]


@dataclass(frozen=True)
class NodeImage:
    """The node image of one placement. `id`: the file's image (or, on AWS, the SSM
    parameter of the base image); `carries`/`digest`: what its build record says."""

    id: str | None
    prepulled: bool
    source: Source
    carries: str | None = None
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def images_dir() -> Path:
    return poolctl_home() / "images"


def record_file(cloud: Cloud, image_id: str) -> Path:
    return images_dir() / f"{cloud}-{re.sub(r'[^A-Za-z0-9._-]+', '_', image_id)}.json"


def find_record(cloud: Cloud, image_id: str | None) -> dict[str, Any] | None:
    if not image_id:
        return None
    try:
        rec: dict[str, Any] = json.loads(record_file(cloud, image_id).read_text())
        return rec
    except (OSError, ValueError):
        return None


def save_record(rec: dict[str, Any]) -> Path:
    path = record_file(rec["cloud"], rec["image_id"])
    write_private(path, json.dumps(rec, indent=2) + "\n")
    return path


def placement_image(pool: Pool, cloud: Cloud) -> str | None:
    """The node image a placement names in the file (None: the base image at deploy)."""
    placement = pool.placement(cloud)
    # Asked only for a cloud the pool has a placement on (sizing's instance_row checks it).
    assert placement is not None
    return placement.ami_id if isinstance(placement, AwsPlacement) else placement.image


def file_node_image(pool: Pool, cloud: Cloud) -> NodeImage:
    """The file alone: what synthesis uses, so that the stack's JSON is the same on every
    machine, build records or not."""
    image = placement_image(pool, cloud)
    aws = pool.aws if cloud == Cloud.aws else None
    shown = image or (aws.ami_ssm_parameter if aws is not None else None)
    return NodeImage(id=shown, prepulled=pool.serving.image_prepulled,
                     source="serving.image_prepulled")


def recorded_node_image(pool: Pool, cloud: Cloud) -> NodeImage:
    """A build record says whether an image poolctl built carries the pool's serving image;
    without one, the file's `serving.image_prepulled` says it for the user's own image."""
    image = placement_image(pool, cloud)
    rec = find_record(cloud, image)
    if rec is None:
        return file_node_image(pool, cloud)
    return NodeImage(id=image, prepulled=rec.get("serving_image") == pool.serving.image,
                     source="build record", carries=rec.get("serving_image"),
                     digest=rec.get("digest"))
