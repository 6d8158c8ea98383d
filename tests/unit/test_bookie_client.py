"""The bookie client's one decision: how often "no responders" from a bookie is asked
again, by how long ago the bookie registered."""

from __future__ import annotations

import pytest

from shared.bookie_client import NO_RESPONDERS_RETRIES, no_responders_retries

GRACE_MS = 5_000


@pytest.mark.parametrize(
    ("registered_at_ms", "now_ms", "retries"),
    [
        (None, 100_000, NO_RESPONDERS_RETRIES),  # never seen registered: it may be starting
        (100_000, 100_000, NO_RESPONDERS_RETRIES),  # just registered
        (100_000, 104_999, NO_RESPONDERS_RETRIES),
        (100_000, 105_000, 0),  # registered a grace ago: it is gone, fail at once
        (100_000, 900_000, 0),
        (100_000, 90_000, NO_RESPONDERS_RETRIES),  # its clock ahead of ours: still new
    ],
)
def test_no_responders_retries_only_for_a_bookie_that_just_registered(
    registered_at_ms, now_ms, retries
) -> None:
    assert no_responders_retries(registered_at_ms, now_ms, GRACE_MS) == retries
