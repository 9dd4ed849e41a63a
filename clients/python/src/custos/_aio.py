"""The asyncio client: one Unix-socket connection shared by every task of one event loop.

A reader task splits what the daemon sends into responses (matched to their request by id, so
concurrent calls and runs share the connection) and exec.event notifications (kept per
subscription until read).
"""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType
from typing import Any, Awaitable, Dict, Optional, Type

from ._api import _Api
from ._errors import CustosError, unavailable
from ._plan import PathLike, default_socket_path
from ._run import (
    RECONNECT_BUDGET,
    Call,
    Driving,
    NextEvent,
    Outcome,
    Reconnect,
    Step,
    Steps,
)
from ._wire import Wire, result_of


class AsyncClient(_Api[Awaitable[Any]]):
    """The asyncio client: every method of `Client`, awaited.

    `async with AsyncClient(path) as client: await client.host_info()`. The connection is made
    at the first call (or on entering the context), and made again when the daemon closed it
    for being idle. Concurrent calls and `run`s on one client share its connection.
    """

    def __init__(self, socket_path: Optional[PathLike] = None) -> None:
        self.socket_path = (
            os.fspath(socket_path) if socket_path is not None else default_socket_path()
        )
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional["asyncio.Task[None]"] = None
        self._wire = Wire()
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        self._changed: Optional[asyncio.Condition] = None
        self._lost: Optional[CustosError] = None
        self._connecting: Optional[asyncio.Lock] = None
        self._generation = 0  # connections made so far

    async def __aenter__(self) -> "AsyncClient":
        await self._connected()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection; calls in flight fail with rpc.unavailable, subscriptions on it
        end (their executions run on)."""
        task, writer = self._reader_task, self._writer
        self._reader_task, self._writer = None, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
        self._fail_all(unavailable("the client was closed"))
        await self._notify()  # next_event waiters raise it

    async def _connected(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
            self._changed = asyncio.Condition()
        async with self._connecting:
            if self._writer is not None and self._lost is None:
                return self._writer
            if self._writer is not None:
                await self.close()
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as exc:
                raise unavailable(
                    f"no custos daemon at {self.socket_path} ({exc.strerror or exc})", exc.errno
                ) from exc
            self._wire, self._lost, self._writer = Wire(), None, writer
            self._generation += 1
            self._reader_task = asyncio.ensure_future(self._read_loop(reader))
            return writer

    async def _reconnect(self, since: Optional[int]) -> None:
        """A connection other than generation `since` (the one a run lost): the current one if
        another task made one already, else a new one, connects retried with backoff for up to
        RECONNECT_BUDGET seconds while the daemon does not answer."""
        if self._generation == since:
            await self.close()
        deadline = time.monotonic() + RECONNECT_BUDGET
        pause = 0.05
        while True:
            try:
                await self._connected()
                return
            except CustosError:
                if time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    data = await reader.read(1 << 20)
                except OSError as exc:
                    raise unavailable(f"daemon connection lost ({exc})", exc.errno) from exc
                if not data:
                    raise unavailable("the daemon closed the connection")
                for rid, msg in self._wire.feed(data):
                    self._answer(rid, msg)
                await self._notify()
        except CustosError as exc:
            self._fail_all(exc)
            await self._notify()

    def _answer(self, rid: Optional[int], msg: Dict[str, Any]) -> None:
        # An error the daemon could not attribute (id null) answers every request in flight.
        waiting = [self._pending.pop(rid)] if rid in self._pending else []
        if rid is None:
            waiting, self._pending = list(self._pending.values()), {}
        for future in waiting:
            if not future.done():
                try:
                    future.set_result(result_of(msg))
                except CustosError as exc:
                    future.set_exception(exc)

    def _fail_all(self, error: CustosError) -> None:
        self._lost = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    # -- calls
    def _request(self, method: str, params: Dict[str, Any]) -> Awaitable[Any]:
        return self._call(method, params)

    async def _call(self, method: str, params: Dict[str, Any]) -> Any:
        writer = await self._connected()
        rid, line = self._wire.encode(method, params)
        future: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            writer.write(line)
            await writer.drain()
        except OSError as exc:
            self._pending.pop(rid, None)
            raise unavailable(f"daemon connection lost while sending ({exc})", exc.errno) from exc
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    async def next_event(
        self, subscription: Optional[str] = None, *, timeout: Optional[float] = None
    ) -> Optional[Dict[str, Any]]:
        """The next `exec.event` (its params) of `subscription`, or of any subscription on this
        connection; None when none came within `timeout` seconds (None: wait)."""
        if self._changed is None:
            await self._connected()
        changed = self._changed
        assert changed is not None
        events = self._wire.events

        def ready() -> bool:
            return events.has(subscription) or self._lost is not None

        async with changed:
            try:
                await asyncio.wait_for(changed.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                return None
        if events.has(subscription):
            return events.take(subscription)
        assert self._lost is not None
        raise self._lost

    # -- run()'s driver (the protocol is in _run.py)
    def _drive(self, steps: Steps) -> Awaitable[Any]:
        return self._drive_async(steps)

    async def _drive_async(self, steps: Steps) -> Dict[str, Any]:
        run = Driving(steps)
        try:
            step = run.first()
            while step is not None:
                outcome = await self._perform(step, run)
                step = run.advance(run.seen(self._generation, outcome))
            return run.result
        finally:
            run.abandon(self._wire.events)

    async def _perform(self, step: Step, run: Driving) -> Outcome:
        try:
            if isinstance(step, Call):
                return Outcome(await self._call(step.method, step.params))
            if isinstance(step, NextEvent):
                return Outcome(await self.next_event(step.subscription))
            if isinstance(step, Reconnect):
                await self._reconnect(run.generation)
                return Outcome()
            await asyncio.sleep(step.seconds)
            return Outcome()
        except CustosError as exc:
            return Outcome(error=exc)
