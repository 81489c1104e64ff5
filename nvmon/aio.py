"""asyncio helpers shared by the publisher, the subscriber and the simulated fleet."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Generic, TypeVar

T = TypeVar("T")


def raise_if_cancelled() -> None:
    """Re-raise a cancellation that an awaited call swallowed.

    On Python 3.11, `asyncio.wait_for` (which aiomqtt 2.x uses for every publish, subscribe and
    connect) can return normally when its inner future completes in the same loop iteration as a
    `cancel()` of the calling task (CPython gh-86296, fixed in 3.12). The task then keeps running
    with `cancelling() > 0` and nothing left to stop it, so a TaskGroup waiting for it hangs.
    Call this after such awaits in loops that must stop when cancelled.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@contextlib.asynccontextmanager
async def running(coro: Coroutine, *, name: str):
    """`async with running(x.run(), name=...):` runs `coro` as a task for the block, then cancels
    it and waits for it."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Latest(Generic[T]):
    """The newest item of each key, waiting to be handled (a control topic's latest message): `put`
    replaces an unhandled older one and says so; `wait()` until something was put (or `wake()`);
    `pop()` the item of the key put longest ago."""

    def __init__(self) -> None:
        self._items: dict[str, T] = {}
        self._wake = asyncio.Event()

    def put(self, key: str, item: T) -> bool:
        """Keep `item` as `key`'s newest; True when it replaced one not yet handled."""
        replaced = key in self._items
        self._items.pop(key, None)
        self._items[key] = item
        self._wake.set()
        return replaced

    def wake(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake.clear()

    def pop(self) -> tuple[str, T]:
        key = next(iter(self._items))
        return key, self._items.pop(key)

    def __len__(self) -> int:
        return len(self._items)
