"""Reading back what a test's services published on the events stream."""

from __future__ import annotations

import json

from shared.subjects import Subjects


async def stream_events(js, subjects: Subjects) -> list[dict]:
    """Every message in the events stream of `subjects`, in stream order."""
    info = await js.stream_info(subjects.event_stream)
    out: list[dict] = []
    if info.state.messages == 0:
        return out
    for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
        msg = await js.get_msg(subjects.event_stream, seq)
        out.append(json.loads(msg.data))
    return out
