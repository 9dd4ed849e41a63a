"""Framing and routing shared by both clients (no I/O here).

One JSON-RPC 2.0 message per `\\n`-terminated line (docs/api.md, "Transport"). Responses are
matched to requests by id (calls on one connection may be answered out of order); `exec.event`
notifications are kept per subscription until read.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from ._errors import from_rpc_error, protocol_error

Message = Dict[str, Any]


class Events:
    """exec.event params per subscription, in arrival order, until taken."""

    def __init__(self) -> None:
        self._queues: Dict[str, Deque[Tuple[int, Message]]] = {}
        self._arrived = 0
        self._ignored: Set[str] = set()

    def put(self, params: Message) -> None:
        sub = params.get("subscription")
        if not isinstance(sub, str):
            return
        if sub in self._ignored:
            if params.get("kind") == "terminal":  # the subscription's last event
                self._ignored.discard(sub)
            return
        self._arrived += 1
        self._queues.setdefault(sub, deque()).append((self._arrived, params))

    def has(self, subscription: Optional[str]) -> bool:
        return bool(self._queues) if subscription is None else subscription in self._queues

    def take(self, subscription: Optional[str]) -> Optional[Message]:
        """The next event of `subscription` (None: of any subscription), or None."""
        if subscription is None:
            if not self._queues:
                return None
            subscription = min(self._queues, key=lambda s: self._queues[s][0][0])
        queue = self._queues.get(subscription)
        if not queue:
            return None
        _, event = queue.popleft()
        if not queue:
            del self._queues[subscription]
        return event

    def forget(self, subscription: str) -> None:
        """Drops the subscription's events, now and until its terminal event (a run given up)."""
        queued = self._queues.pop(subscription, deque())
        if not any(ev.get("kind") == "terminal" for _, ev in queued):
            self._ignored.add(subscription)


class Wire:
    """Encodes requests and splits what the daemon sends into responses and events."""

    def __init__(self) -> None:
        self.events = Events()
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline
        self._next_id = 0

    def encode(self, method: str, params: Dict[str, Any]) -> Tuple[int, bytes]:
        self._next_id += 1
        request = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        try:
            text = json.dumps(request, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise protocol_error(f"{method}: params are not JSON: {exc}") from exc
        return self._next_id, text.encode("utf-8") + b"\n"

    def feed(self, data: bytes) -> List[Tuple[Optional[int], Message]]:
        """Takes bytes read from the socket; returns the responses completed by them as
        (id, message), id None for an error the daemon could not attribute to a request."""
        self._buffer += data
        responses: List[Tuple[Optional[int], Message]] = []
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(self._buffer)
                return responses
            line = bytes(self._buffer[:newline]).rstrip(b"\r")
            del self._buffer[: newline + 1]
            self._scanned = 0
            if line.strip():
                self._dispatch(line, responses)

    def _dispatch(self, line: bytes, responses: List[Tuple[Optional[int], Message]]) -> None:
        try:
            msg = json.loads(line)
        except ValueError as exc:
            raise protocol_error(f"the daemon sent a line that is not JSON: {exc}") from exc
        if not isinstance(msg, dict):
            raise protocol_error("the daemon sent something that is not a JSON object")
        if "method" in msg and "id" not in msg:
            params = msg.get("params")
            if msg.get("method") == "exec.event" and isinstance(params, dict):
                self.events.put(params)
            return
        rid = msg.get("id")
        responses.append((rid if isinstance(rid, int) else None, msg))


def result_of(msg: Message) -> Any:
    """A response's result, or its error raised as a CustosError."""
    if "error" in msg:
        raise from_rpc_error(msg["error"])
    if "result" not in msg:
        raise protocol_error("a response without result or error")
    return msg["result"]
