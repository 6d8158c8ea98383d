"""The deadline wheel of a client's writer handles (shared/protocol/driver.py:DeadlineWheel)
with stand-in handles: each is ticked once its deadline has come, never before; a moved
or cancelled deadline is forgotten; the handles due in one slot cost one event-loop
timer, whatever their number. Counts loop timers and ticks; the waits poll with a
deadline."""

from __future__ import annotations

import asyncio

from shared.protocol.driver import DeadlineWheel, monotonic_ms

WAIT_S = 5.0


class Handle:
    """What the wheel needs of a WriterHandle: its armed deadline, and a tick."""

    def __init__(self) -> None:
        self.deadline_ms: int | None = None
        self.ticked_at: list[int] = []
        self.due_ms = 0

    def deadline_reached(self, now_ms: int) -> None:
        self.ticked_at.append(now_ms)


def counting_timers(monkeypatch) -> list[float]:
    """The delays of the wheel's call_laters on the running loop."""
    loop = asyncio.get_running_loop()
    delays: list[float] = []
    call_later = loop.call_later

    def counted(delay, callback, *args, **kwargs):
        if getattr(callback, "__self__", None).__class__ is DeadlineWheel:
            delays.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", counted)
    return delays


async def until(condition, timeout_s: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "not reached in time"
        await asyncio.sleep(0.005)


async def test_handles_due_in_one_slot_share_one_loop_timer(monkeypatch) -> None:
    delays = counting_timers(monkeypatch)
    wheel = DeadlineWheel(monotonic_ms, resolution_ms=50)
    # Every deadline in one slot: after now, on the slot's last ms at the latest.
    slot_end = (monotonic_ms() // 50 + 2) * 50
    handles = [Handle() for _ in range(1_000)]
    for i, handle in enumerate(handles):
        handle.due_ms = slot_end - i % 40
        wheel.arm(handle, handle.due_ms)
    assert len(wheel) == 1_000
    await until(lambda: all(h.ticked_at for h in handles))
    assert all(h.ticked_at == [h.ticked_at[0]] for h in handles)  # once each
    assert all(h.ticked_at[0] >= h.due_ms for h in handles)  # never early
    assert all(h.deadline_ms is None for h in handles)
    assert len(wheel) == 0
    assert len(delays) <= 2, delays  # one timer (and one more if the loop fired it early)


async def test_a_moved_or_cancelled_deadline_is_forgotten(monkeypatch) -> None:
    wheel = DeadlineWheel(monotonic_ms, resolution_ms=5)
    now = monotonic_ms()
    moved, cancelled, kept = Handle(), Handle(), Handle()
    wheel.arm(moved, now + 20)
    wheel.arm(moved, now + 60)  # later: replaces the first
    wheel.arm(cancelled, now + 20)
    wheel.cancel(cancelled)
    assert cancelled.deadline_ms is None
    wheel.arm(kept, now + 40)
    await until(lambda: moved.ticked_at and kept.ticked_at)
    assert len(moved.ticked_at) == 1 and moved.ticked_at[0] >= now + 60
    assert cancelled.ticked_at == []
    await until(lambda: not wheel.timer_armed)  # nothing armed: no timer left behind
    assert len(wheel) == 0
    wheel.close()


async def test_a_tick_may_arm_the_next_deadline() -> None:
    wheel = DeadlineWheel(monotonic_ms, resolution_ms=5)

    class Rearming(Handle):
        def deadline_reached(self, now_ms: int) -> None:
            super().deadline_reached(now_ms)
            if len(self.ticked_at) < 3:
                wheel.arm(self, now_ms + 10)

    handle = Rearming()
    wheel.arm(handle, monotonic_ms() + 10)
    await until(lambda: len(handle.ticked_at) == 3)
    first, second, third = handle.ticked_at
    assert second >= first + 10 and third >= second + 10
    await until(lambda: not wheel.timer_armed)
    assert handle.deadline_ms is None


async def test_a_tick_that_arms_a_far_deadline_leaves_a_nearer_one_armed() -> None:
    wheel = DeadlineWheel(monotonic_ms, resolution_ms=5)

    class FarAway(Handle):
        def deadline_reached(self, now_ms: int) -> None:
            super().deadline_reached(now_ms)
            wheel.arm(self, now_ms + 600_000)

    now = monotonic_ms()
    first, later = FarAway(), Handle()
    wheel.arm(first, now + 10)
    wheel.arm(later, now + 40)
    # `first`'s tick arms ten minutes ahead; `later` is still due in 40 ms.
    await until(lambda: later.ticked_at)
    assert len(first.ticked_at) == 1 and later.ticked_at[0] >= now + 40
    wheel.close()
