"""The blocking client: one Unix-socket connection, used by one thread at a time."""

from __future__ import annotations

import os
import select
import socket
import time
from types import TracebackType
from typing import Any, Dict, Optional, Type

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
from ._wire import Message, Wire, result_of


class Client(_Api[Any]):
    """A blocking client of the custos daemon.

    `socket_path` None follows the CLI's rule (`$CUSTOS_SOCKET`, else `./.custos/custos.sock`
    when it exists, else `/run/custos/custos.sock`). The connection is made at the first call,
    and made again when the daemon closed it for being idle. Every method of the API is a method
    here (`host_info()`, `exec_start(identity, plan, ...)`, ...); `call(method, **params)` sends
    any method by name. Errors raise CustosError. `run()` goes on across a daemon handover
    (a new connection, its events resumed; see the README).
    """

    def __init__(self, socket_path: Optional[PathLike] = None) -> None:
        self.socket_path = (
            os.fspath(socket_path) if socket_path is not None else default_socket_path()
        )
        self._sock: Optional[socket.socket] = None
        self._wire = Wire()
        self._responses: Dict[Optional[int], Message] = {}
        self._generation = 0  # connections made so far

    # -- connection
    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection; subscriptions on it end (their executions run on)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._wire = Wire()
        self._responses.clear()

    def _connected(self) -> socket.socket:
        if self._sock is not None and self._closed_by_peer(self._sock):
            self.close()
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
            except OSError as exc:
                sock.close()
                raise unavailable(
                    f"no custos daemon at {self.socket_path} ({exc.strerror or exc})", exc.errno
                ) from exc
            self._sock = sock
            self._generation += 1
        return self._sock

    def _reconnect(self, since: Optional[int]) -> None:
        """A connection other than generation `since` (the one a run lost): the current one if
        it is another already, else a new one, connects retried with backoff for up to
        RECONNECT_BUDGET seconds while the daemon does not answer."""
        if self._generation == since:
            self.close()
        deadline = time.monotonic() + RECONNECT_BUDGET
        pause = 0.05
        while True:
            try:
                self._connected()
                return
            except CustosError:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _closed_by_peer(self, sock: socket.socket) -> bool:
        """Whether the daemon closed the connection (its idle timeout); reads what is pending."""
        try:
            # Bounded: a subscription's events may keep the socket readable without end.
            for _ in range(16):
                if not select.select([sock], [], [], 0)[0]:
                    break
                data = sock.recv(1 << 20)
                if not data:
                    return True
                self._take(data)
        except OSError:
            return True
        return False

    def _take(self, data: bytes) -> None:
        for rid, msg in self._wire.feed(data):
            self._responses[rid] = msg

    def _read(self, timeout: Optional[float]) -> bool:
        """Reads what the daemon sends within `timeout` seconds (None: until something comes);
        False when nothing came."""
        sock = self._sock
        if sock is None:
            raise unavailable("not connected to the daemon")
        try:
            if not select.select([sock], [], [], timeout)[0]:
                return False
            data = sock.recv(1 << 20)
        except OSError as exc:
            self.close()
            raise unavailable(f"daemon connection lost ({exc})", exc.errno) from exc
        if not data:
            self.close()
            raise unavailable("the daemon closed the connection")
        self._take(data)
        return True

    # -- calls
    def _request(self, method: str, params: Dict[str, Any]) -> Any:
        sock = self._connected()
        rid, line = self._wire.encode(method, params)
        try:
            sock.sendall(line)
        except OSError as exc:
            self.close()
            raise unavailable(f"daemon connection lost while sending ({exc})", exc.errno) from exc
        while rid not in self._responses and None not in self._responses:
            self._read(None)
        # An error the daemon could not attribute (id null) answers the request in flight.
        return result_of(self._responses.pop(rid if rid in self._responses else None))

    def next_event(
        self, subscription: Optional[str] = None, *, timeout: Optional[float] = None
    ) -> Optional[Dict[str, Any]]:
        """The next `exec.event` (its params) of `subscription`, or of any subscription on this
        connection; None when none came within `timeout` seconds (None: wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._wire.events.has(subscription):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._read(left) and deadline is not None and time.monotonic() >= deadline:
                return None
        return self._wire.events.take(subscription)

    def _drive(self, steps: Steps) -> Dict[str, Any]:
        run = Driving(steps)
        try:
            step = run.first()
            while step is not None:
                outcome = self._perform(step, run)  # before reading the generation it leaves
                step = run.advance(run.seen(self._generation, outcome))
            return run.result
        finally:
            run.abandon(self._wire.events)

    def _perform(self, step: Step, run: Driving) -> Outcome:
        try:
            if isinstance(step, Call):
                return Outcome(self._request(step.method, step.params))
            if isinstance(step, NextEvent):
                return Outcome(self.next_event(step.subscription))
            if isinstance(step, Reconnect):
                self._reconnect(run.generation)
                return Outcome()
            time.sleep(step.seconds)
            return Outcome()
        except CustosError as exc:
            return Outcome(error=exc)
