"""Reading back what a test's services published on the events stream."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

import nats.errors
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from shared.subjects import Subjects


async def jetstream_ready(nc) -> bool:
    """The cluster elected its JetStream meta leader (a few seconds after the ports open)."""
    try:
        await nc.jetstream().account_info()
    except (APIError, nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False
    return True


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


class ScratchStream:
    """A JetStream stream of its own for one test, on subjects of its own
    (`<prefix>.events.<kind>`, as the services publish)."""

    def __init__(self, js, name: str, prefix: str) -> None:
        self.js, self.name, self.prefix = js, name, prefix

    async def publish_raw(self, kind: str, payload: bytes) -> None:
        await self.js.publish(f"{self.prefix}.events.{kind}", payload)


S = TypeVar("S", bound=ScratchStream)


@asynccontextmanager
async def scratch_stream(nc, kind: type[S]) -> AsyncIterator[S]:
    """A fresh stream (a `kind` of ScratchStream), deleted at the end."""
    js = nc.jetstream()
    tag = os.urandom(4).hex()
    name, prefix = f"EVENTS_{tag}", f"t{tag}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.events.>"]))
    try:
        yield kind(js, name, prefix)
    finally:
        await js.delete_stream(name)
