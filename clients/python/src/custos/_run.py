"""The whole-run protocol of `run()`, written once for both clients (no I/O here).

`run_steps` is a generator: it yields `Call` (a request whose result it needs), `NextEvent`
(the next exec.event of its subscription) or `Sleep`, and the client's driver sends back each
`Outcome`. The protocol is the CLI's (src/cli/cmd_run.cpp, docs/api.md): one `exec.start` with
`subscribe: true`; its events follow on the same connection, terminal last and never dropped.
Output events dropped for a slow reader (a gap in a stream's offsets) and bytes no event
carried (beyond the plan's event budget, or evicted before the start was answered) are read
back from the spool with `exec.output` by offset, so `on_output` gets every byte once, in order.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, NamedTuple, Optional, Union

from ._errors import CustosError, protocol_error

if TYPE_CHECKING:
    from ._wire import Events

OutputCallback = Callable[[str, bytes], None]
StartCallback = Callable[[Dict[str, Any]], None]

#: The most one exec.output slice carries (the daemon caps max_bytes there).
SPOOL_SLICE = 1 << 20
#: The most one exec.input carries, decoded (the daemon refuses more).
INPUT_CHUNK = 512 * 1024


class Call(NamedTuple):
    method: str
    params: Dict[str, Any]


class NextEvent(NamedTuple):
    subscription: str


class Sleep(NamedTuple):
    seconds: float


Step = Union[Call, NextEvent, Sleep]


class Outcome(NamedTuple):
    value: Any = None
    error: Optional[CustosError] = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


Steps = Generator[Step, Outcome, Dict[str, Any]]


def _obj(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise protocol_error(f"{what}: expected an object, got {value!r}")
    return value


def _b64(text: Any) -> bytes:
    try:
        return base64.b64decode(text if isinstance(text, str) else "", validate=True)
    except ValueError as exc:
        raise protocol_error(f"bad data_b64 from the daemon: {exc}") from exc


class _Streams:
    """Bytes delivered so far per stream, and the spool reads that close gaps."""

    def __init__(self, execution_id: str, on_output: Optional[OutputCallback]) -> None:
        self.execution_id = execution_id
        self.on_output = on_output
        self.done: Dict[str, int] = {}

    def fill(self, stream: str, upto: Optional[int]) -> Generator[Step, Outcome, None]:
        """Delivers the stream from what was delivered up to `upto` (None: the spool's end)."""
        while upto is None or self.done.get(stream, 0) < upto:
            done = self.done.get(stream, 0)
            want = SPOOL_SLICE if upto is None else min(SPOOL_SLICE, upto - done)
            params = {"execution_id": self.execution_id, "stream": stream, "offset": done,
                      "max_bytes": want}
            got = _obj((yield Call("exec.output", params)).get(), "exec.output")
            data = _b64(got.get("data_b64"))
            if not data:
                return  # the spool holds no more (spool_bytes, or truncated output)
            self.deliver(stream, data)

    def deliver(self, stream: str, data: bytes) -> None:
        self.done[stream] = self.done.get(stream, 0) + len(data)
        if self.on_output is not None and data:
            self.on_output(stream, data)

    def output_event(self, event: Dict[str, Any]) -> Generator[Step, Outcome, None]:
        stream = event.get("stream")
        if not isinstance(stream, str):
            return
        data = _b64(event.get("data_b64"))
        done = self.done.get(stream, 0)
        offset = event.get("offset")
        offset = offset if isinstance(offset, int) else done
        if offset > done and self.on_output is not None:
            yield from self.fill(stream, offset)
            done = self.done.get(stream, 0)
        if offset + len(data) <= done:
            return  # already delivered (replay overlap)
        # Whatever the spool could not give back before `offset` is skipped, as the CLI does.
        skip = max(0, done - offset)
        self.done[stream] = offset + skip
        self.deliver(stream, data[skip:])

    def drain(self, terminal: Dict[str, Any]) -> Generator[Step, Outcome, None]:
        """After the terminal event: each stream whose observed count (the terminal record's
        accounting) was not delivered in full is read to the spool's end."""
        if self.on_output is None:
            return
        output = terminal.get("output")
        for stream, acc in (output.items() if isinstance(output, dict) else ()):
            observed = acc.get("observed") if isinstance(acc, dict) else None
            if isinstance(observed, int) and self.done.get(stream, 0) >= observed:
                continue
            yield from self.fill(stream, None)


def _send_input(execution_id: str, data: bytes) -> Generator[Step, Outcome, None]:
    """Writes `data` to the execution's stdin and closes it; the daemon may accept fewer bytes
    than offered (the rest is offered again). Stops, as the CLI does, when the input is refused
    (the program closed its stdin, or limits.stdin_bytes)."""
    pos = 0
    while True:
        chunk = data[pos : pos + INPUT_CHUNK]
        last = pos + len(chunk) >= len(data)
        params: Dict[str, Any] = {"execution_id": execution_id, "eof": last}
        if chunk:
            params["data_b64"] = base64.b64encode(chunk).decode("ascii")
        outcome = yield Call("exec.input", params)
        if outcome.error is not None:
            return
        accepted = _obj(outcome.value, "exec.input").get("accepted_bytes")
        accepted = accepted if isinstance(accepted, int) else 0
        pos += accepted
        if accepted >= len(chunk):
            if last:
                return
        else:
            yield Sleep(0.01)  # the daemon's queue is full: give the program a moment to read


def run_steps(
    params: Dict[str, Any],
    *,
    grant: Optional[str],
    input: Optional[bytes],  # noqa: A002 - as subprocess.run
    on_output: Optional[OutputCallback],
    on_start: Optional[StartCallback],
) -> Steps:
    if grant is not None:
        # A grant is checked against the current authority epoch: read it right before starting.
        listed = _obj((yield Call("authority.list", {"grant_id": grant})).get(), "authority.list")
        params["authority"] = dict(params["authority"], grant_id=grant, epoch=listed.get("epoch"))
    params["subscribe"] = True
    started = _obj((yield Call("exec.start", params)).get(), "exec.start")
    execution_id = started.get("execution_id")
    if not isinstance(execution_id, str):
        raise protocol_error(f"exec.start answered without an execution_id: {started!r}")
    subscription = started.get("subscription")
    if not isinstance(subscription, str):
        # The daemon could not attach the events to the answer (docs/api.md): ask for them.
        again = (yield Call("exec.subscribe", {"execution_id": execution_id, "from_seq": 1})).get()
        subscription = _obj(again, "exec.subscribe").get("subscription")
        if not isinstance(subscription, str):
            raise protocol_error(f"exec.subscribe answered without a subscription: {again!r}")
    if on_start is not None:
        on_start(started)
    if input is not None:
        yield from _send_input(execution_id, bytes(input))
    streams = _Streams(execution_id, on_output)
    while True:
        event = _obj((yield NextEvent(subscription)).get(), "exec.event")
        kind = event.get("kind")
        if kind == "output":
            yield from streams.output_event(event)
        elif kind == "terminal":
            terminal = event.get("terminal")
            if not isinstance(terminal, dict) or "classification" not in terminal:
                waited = (yield Call("exec.wait", {"execution_id": execution_id})).get()
                terminal = _obj(waited, "exec.wait")
            yield from streams.drain(terminal)
            return terminal



def subscription_of(outcome: Outcome) -> Optional[str]:
    """The subscription a call's result opened (exec.start with subscribe, exec.subscribe)."""
    sub = outcome.value.get("subscription") if isinstance(outcome.value, dict) else None
    return sub if isinstance(sub, str) else None


class Driving:
    """A client's driver's bookkeeping for one run: the next step, the result, and the
    subscription whose events are dropped if the run is given up (an exception, a cancelled
    task) before its terminal event."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self._subscription: Optional[str] = None
        self.finished = False
        self.result: Dict[str, Any] = {}

    def first(self) -> Optional[Step]:
        return next(self._steps)

    def advance(self, outcome: Outcome) -> Optional[Step]:
        """The step after `outcome`, or None once the run has its terminal result."""
        self._subscription = subscription_of(outcome) or self._subscription
        try:
            return self._steps.send(outcome)
        except StopIteration as stop:
            self.finished, self.result = True, stop.value
            return None

    def abandon(self, events: "Events") -> None:
        self._steps.close()
        if not self.finished and self._subscription is not None:
            events.forget(self._subscription)
