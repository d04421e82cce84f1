"""One rollout status on both clouds: AWS's instance refresh words map onto poolctl's, and the
cloud's own word stays beside it (`cloud_status`)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from poolctl.clouds.aws.rollout import refresh_state
from poolctl.clouds.base import RolloutState, RolloutStatus


def refresh(status: str, pct: float = 40.0) -> dict:
    """An instance refresh as DescribeInstanceRefreshes returns it (the fields refresh_state
    reads)."""
    return {"InstanceRefreshId": "r-1", "Status": status, "PercentageComplete": pct,
            "Preferences": {"CheckpointPercentages": [25, 50, 100]},
            "DesiredConfiguration": {"LaunchTemplate": {"Version": "3"}}}


# Every Status the Auto Scaling API reference lists, and what poolctl says for it.
@pytest.mark.parametrize(("aws", "ours", "done"), [
    ("Pending", "pending", False),
    ("InProgress", "in_progress", False),
    ("Baking", "in_progress", False),  # waiting out the bake time after the last step
    ("Successful", "successful", True),
    ("Failed", "failed", True),
    ("Cancelling", "cancelling", False),
    ("Cancelled", "cancelled", True),
    ("RollbackInProgress", "rolling_back", False),
    ("RollbackSuccessful", "rolled_back", True),
    ("RollbackFailed", "rollback_failed", True),
])
def test_aws_refresh_words_map_onto_poolctls(aws, ours, done):
    s = refresh_state(refresh(aws), group_version="2")
    assert (s.status, s.cloud_status, s.done) == (ours, aws, done)
    assert isinstance(s.status, RolloutStatus)
    d = json.loads(json.dumps(asdict(s)))
    assert (d["status"], d["cloud_status"]) == (ours, aws)


def test_a_word_aws_adds_later_reads_as_in_progress_not_done():
    s = refresh_state(refresh("Resizing"), group_version="2")
    assert (s.status, s.cloud_status, s.done) == ("in_progress", "Resizing", False)


def test_turning_back_drops_the_forward_percentage():
    back = [st for st in RolloutStatus if st.turned_back]
    assert {b.value for b in back} == {"cancelling", "cancelled", "rolling_back",
                                       "rolled_back", "rollback_failed"}
    assert RolloutStatus.rolling_back.words == "rolling back"


def test_a_state_read_back_from_json_has_the_enum():
    s = RolloutState(**{"id": "r-1", "status": "rolled_back", "done": True,
                        "percentage_complete": 0.0})
    assert s.status is RolloutStatus.rolled_back
    with pytest.raises(ValueError):
        RolloutState(id="r-1", status="RollbackSuccessful", done=True, percentage_complete=0)
