"""Waiting for a condition in async tests: poll it until it holds or a deadline passes
(never a sleep standing in for the condition)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

POLL_S = 0.05


async def until(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll `condition` (sync or async) until it is truthy; its value. Fails naming `what`
    once `timeout_s` has passed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(POLL_S)
