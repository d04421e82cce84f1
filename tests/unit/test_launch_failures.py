"""Failed launches named from the group's scaling activities (AWS writes no code there: the
code is recognised from EC2's message) and the one line that names them."""

from __future__ import annotations

import pytest

from poolctl.clouds.aws.capacity import failure_code
from poolctl.clouds.base import LaunchFailure, failures_line

ICE = ("We currently do not have sufficient p5.48xlarge capacity in the Availability Zone you "
       "requested (us-east-1a). Our system will be working on provisioning additional capacity. "
       "Launching EC2 instance failed.")
EXCEEDED = ("The requested reservation does not have sufficient compatible and available "
            "capacity for this request. Launching EC2 instance failed.")


@pytest.mark.parametrize(("message", "want"), [
    (ICE, ("InsufficientInstanceCapacity", "p5.48xlarge", "us-east-1a")),
    ("We currently do not have sufficient p5.48xlarge capacity at this time.",
     ("InsufficientInstanceCapacity", "p5.48xlarge", "")),
    (EXCEEDED, ("ReservationCapacityExceeded", "", "")),
    ("The image id '[ami-1]' does not exist. Launching EC2 instance failed.", ("", "", "")),
])
def test_failure_code_from_ec2s_message(message, want):
    assert failure_code(message) == want


def test_one_line_per_code_and_type_with_its_zones():
    fs = [LaunchFailure("us-east-1b", "p5.48xlarge", "InsufficientInstanceCapacity", "t2"),
          LaunchFailure("us-east-1a", "p5.48xlarge", "InsufficientInstanceCapacity", "t1"),
          LaunchFailure("us-east-1a", "p5.48xlarge", "InsufficientInstanceCapacity", "t0"),
          LaunchFailure("", "p5.48xlarge", "ReservationCapacityExceeded", "t0")]
    assert failures_line(fs) == (
        "InsufficientInstanceCapacity: no p5.48xlarge capacity in us-east-1a, us-east-1b; "
        "ReservationCapacityExceeded: the reservations have no p5.48xlarge left in the region")
