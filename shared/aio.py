"""Small asyncio helpers the services share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)

CANCEL_ATTEMPTS = 20
CANCEL_WAIT_S = 0.5


async def cancel_all(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait for them, cancelling again while any is left: a task can
    lose a cancellation in a race (asyncio.wait_for in Python 3.11), and shutdown must not
    hang on it. What still runs after that is logged and left behind."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(CANCEL_ATTEMPTS):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
    log.error("tasks ignored cancellation", extra={"tasks": [t.get_name() for t in pending]})


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` up to `timeout_s`; whether it is set. (asyncio.timeout, unlike
    asyncio.wait_for in 3.11, never swallows a cancellation.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
