"""The asyncio helpers shutdown relies on."""

import asyncio

from shared.aio import cancel_all, wait_event


async def test_cancel_all_outlasts_a_task_that_swallows_a_cancellation() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 2:
                    raise  # gives in at the third

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_all({task}), 10)
    assert task.cancelled() and swallowed == 3


async def test_cancel_all_of_nothing_or_done_tasks() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_all(set())
    await cancel_all({done})
    assert not done.cancelled()


async def test_wait_event() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True


async def test_wait_event_passes_cancellation_on() -> None:
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(event, 60))
    await asyncio.sleep(0)
    waiter.cancel()
    done, _ = await asyncio.wait({waiter}, timeout=5)
    assert waiter in done and waiter.cancelled()
