"""The whole-run protocol of `run()`, written once for both clients (no I/O here).

`run_steps` is a generator: it yields `Call` (a request whose result it needs), `NextEvent`
(the next exec.event of its subscription) or `Sleep`, and the client's driver sends back each
`Outcome`. The protocol is the CLI's (src/cli/cmd_run.cpp, docs/api.md): one `exec.start` with
`subscribe: true`; its events follow on the same connection, terminal last and never dropped.
Output events dropped for a slow reader (a gap in a stream's offsets) and bytes no event
carried (beyond the plan's event budget, or evicted before the start was answered) are read
back from the spool with `exec.output` by offset, so `on_output` gets every byte once, in order.

A daemon handover (SIGHUP, `custos daemon --reexec`) closes every connection; the run goes on
over a new one, as `custos run` does (docs/cli.md, "Reconnecting"): the driver connects again
(`Reconnect`, retried for up to RECONNECT_BUDGET seconds), the run subscribes from the seq after
the last one it handled (events up to it are skipped if they come again) and reports a
`replay_from` past that seq as a gap (`on_reconnect`, else a `ReconnectGapWarning`); when the
execution is already terminal, or a terminal event comes whose seq it had passed (a new image
that numbered its events from 1 again), the result is exec.wait's. The result is returned once.
"""

from __future__ import annotations

import base64
import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generator,
    NamedTuple,
    Optional,
    Tuple,
    Union,
)

from ._errors import CustosError, protocol_error

if TYPE_CHECKING:
    from ._wire import Events

OutputCallback = Callable[[str, bytes], None]
StartCallback = Callable[[Dict[str, Any]], None]
#: Called after each reconnect of a run with `{"execution_id", "from_seq", "replay_from",
#: "gap"}`: `gap` is True when the daemon could not replay from `from_seq` (events
#: from_seq..replay_from-1 were not kept; output is still read back from the spool).
ReconnectCallback = Callable[[Dict[str, Any]], None]

#: How long a run keeps trying to reach the daemon again after it closed the connection (a
#: handover), in seconds: connects are retried with backoff while the socket refuses them or is
#: absent, for at most this long in total (the CLI's kReconnectBudget).
RECONNECT_BUDGET = 30.0

#: Error codes that mean the connection is gone and the call may be made again on a new one.
LOST_CODES = frozenset({"rpc.unavailable", "daemon.shutting_down"})


class ReconnectGapWarning(UserWarning):
    """A run reconnected after a handover and the daemon could not replay its events from where
    it had stopped (the events in between were not kept). Issued when `run()` has no
    `on_reconnect`."""

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


class Reconnect(NamedTuple):
    """Connect again: the connection this run used was lost (a new one is made unless another
    user of the client already made one), retried for up to RECONNECT_BUDGET seconds."""


Step = Union[Call, NextEvent, Sleep, Reconnect]


class Outcome(NamedTuple):
    value: Any = None
    error: Optional[CustosError] = None
    #: The client's connection is another than at the run's previous step: its subscription
    #: did not survive.
    reconnected: bool = False

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


def lost(error: Optional[CustosError]) -> bool:
    return error is not None and error.code in LOST_CODES


class _Link:
    """Calls that survive the daemon closing the connection, and whether the run's
    subscription has to be made again (the connection changed)."""

    def __init__(self) -> None:
        self.resubscribe = False

    def note(self, outcome: Outcome) -> Outcome:
        if outcome.reconnected:
            self.resubscribe = True
        return outcome

    def reconnect(self) -> Generator[Step, Outcome, None]:
        self.note((yield Reconnect())).get()
        self.resubscribe = True

    def call(self, method: str, params: Dict[str, Any]) -> Generator[Step, Outcome, Any]:
        """A call that can be repeated (exec.output, exec.wait, exec.get, exec.subscribe): made
        again over a new connection when the old one was lost."""
        while True:
            outcome = self.note((yield Call(method, params)))
            if not lost(outcome.error):
                return outcome.get()
            yield from self.reconnect()


class _Streams:
    """Bytes delivered so far per stream, and the spool reads that close gaps."""

    def __init__(
        self, execution_id: str, on_output: Optional[OutputCallback], link: _Link
    ) -> None:
        self.execution_id = execution_id
        self.on_output = on_output
        self.link = link
        self.done: Dict[str, int] = {}

    def fill(self, stream: str, upto: Optional[int]) -> Generator[Step, Outcome, None]:
        """Delivers the stream from what was delivered up to `upto` (None: the spool's end)."""
        while upto is None or self.done.get(stream, 0) < upto:
            done = self.done.get(stream, 0)
            want = SPOOL_SLICE if upto is None else min(SPOOL_SLICE, upto - done)
            params = {"execution_id": self.execution_id, "stream": stream, "offset": done,
                      "max_bytes": want}
            got = _obj((yield from self.link.call("exec.output", params)), "exec.output")
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


def _send_input(execution_id: str, data: bytes, link: _Link) -> Generator[Step, Outcome, None]:
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
        outcome = link.note((yield Call("exec.input", params)))
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
    on_reconnect: Optional[ReconnectCallback] = None,
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
    link = _Link()
    if input is not None:
        yield from _send_input(execution_id, bytes(input), link)
    streams = _Streams(execution_id, on_output, link)
    last_seq = 0  # the highest seq handled
    while True:
        if link.resubscribe:
            again, ended = yield from _resubscribe(link, execution_id, last_seq, on_reconnect)
            if ended is not None:
                yield from streams.drain(ended)
                return ended
            subscription = again or subscription
        outcome = link.note((yield NextEvent(subscription)))
        if lost(outcome.error):
            yield from link.reconnect()
            continue
        event = _obj(outcome.get(), "exec.event")
        kind = event.get("kind")
        seq = event.get("seq")
        seen = isinstance(seq, int) and seq <= last_seq
        if kind == "terminal" and seen:
            # A terminal event of an event log that started again after a handover.
            waited = yield from link.call("exec.wait", {"execution_id": execution_id})
            restarted = _obj(waited, "exec.wait")
            yield from streams.drain(restarted)
            return restarted
        if seen:
            continue  # handled before the reconnect
        if isinstance(seq, int):
            last_seq = seq
        if kind == "output":
            yield from streams.output_event(event)
        elif kind == "terminal":
            carried = event.get("terminal")
            terminal = carried if isinstance(carried, dict) else {}
            if "classification" not in terminal:
                waited = yield from link.call("exec.wait", {"execution_id": execution_id})
                terminal = _obj(waited, "exec.wait")
            yield from streams.drain(terminal)
            return terminal


def _resubscribe(
    link: _Link, execution_id: str, last_seq: int, on_reconnect: Optional[ReconnectCallback]
) -> Generator[Step, Outcome, Tuple[Optional[str], Optional[Dict[str, Any]]]]:
    """After a reconnect: the subscription from the seq after `last_seq` (None when the daemon
    no longer supervises the execution), or the terminal result when the execution already has
    one (it ended meanwhile, or its event log started again below `last_seq`)."""
    while True:
        link.resubscribe = False
        from_seq = last_seq + 1
        sub: Optional[Dict[str, Any]] = None
        try:
            got = yield from link.call(
                "exec.subscribe", {"execution_id": execution_id, "from_seq": from_seq}
            )
            sub = _obj(got, "exec.subscribe")
        except CustosError as exc:
            if exc.code != "exec.not_found":
                raise
        if link.resubscribe:
            continue  # lost again meanwhile
        record = _obj((yield from link.call("exec.get", {"execution_id": execution_id})),
                      "exec.get")
        if link.resubscribe:
            continue
        replay_from = sub.get("replay_from") if sub is not None else None
        gap = isinstance(replay_from, int) and replay_from > from_seq
        report = {"execution_id": execution_id, "from_seq": from_seq,
                  "replay_from": replay_from, "gap": gap}
        if on_reconnect is not None:
            on_reconnect(report)
        elif gap and isinstance(replay_from, int):
            warnings.warn(
                f"reconnected; events {from_seq}..{replay_from - 1} of {execution_id} were not "
                "kept by the daemon (output is read back from the spool)",
                ReconnectGapWarning,
                stacklevel=2,
            )
        subscription = sub.get("subscription") if sub is not None else None
        if not isinstance(subscription, str) or isinstance(record.get("terminal"), dict):
            waited = yield from link.call("exec.wait", {"execution_id": execution_id})
            return None, _obj(waited, "exec.wait")
        return subscription, None



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
        #: The client's connection generation at the run's last step (None before the first).
        self.generation: Optional[int] = None

    def seen(self, generation: int, outcome: Outcome) -> Outcome:
        """`outcome` marked `reconnected` when the connection is another than at the last step."""
        changed = self.generation is not None and generation != self.generation
        self.generation = generation
        return outcome._replace(reconnected=True) if changed else outcome

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
