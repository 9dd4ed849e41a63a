"""`run()` across a real daemon handover (SIGHUP: the daemon re-executes itself and closes every
connection): both clients reconnect, resume the run's events and return its terminal result
once, with no output line delivered twice.

Each test has a daemon of its own (the suite's shared one is not handed over under the other
tests). The handover keeps the executions' pipes, so no line is lost either
(`test_gapless_output_across_a_handover`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from conftest import Daemon, running_daemon
from custos import AsyncClient, Client

LINES = "for i in $(seq 1 30); do echo line $i; sleep 0.1; done"
ALL_LINES = "".join(f"line {i}\n" for i in range(1, 31))
HANGUP_AFTER = 1.2


@pytest.fixture
def own_daemon(binary: str) -> Iterator[Daemon]:
    yield from running_daemon(binary, "custos-pyclient-handover-")


def hang_up_later(d: Daemon) -> threading.Timer:
    assert d.proc is not None
    timer = threading.Timer(HANGUP_AFTER, os.kill, (d.proc.pid, signal.SIGHUP))
    timer.start()
    return timer


def handovers(d: Daemon) -> int:
    deadline = time.monotonic() + 20
    while True:
        try:
            with Client(d.socket) as c:
                handover = c.host_info().get("handover")
            return int(handover["count"]) if isinstance(handover, dict) else 0
        except Exception:  # noqa: BLE001 - the new image may not serve yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Output:
    def __init__(self) -> None:
        self.chunks: List[Tuple[str, bytes]] = []
        self.execution_id = ""

    def started(self, answer: Dict[str, Any]) -> None:
        self.execution_id = answer["execution_id"]

    def __call__(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    def text(self) -> str:
        return b"".join(d for s, d in self.chunks if s == "stdout").decode()


def check(result: Dict[str, Any], out: Output, reports: List[Dict[str, Any]], took: float,
          d: Daemon) -> None:
    assert result["classification"] == "exited", (result, d.tail())
    assert result["exit"]["code"] == 0, result
    assert handovers(d) == 1
    assert took > HANGUP_AFTER, "the run was under way at the handover"
    assert reports, "the run reconnected"
    assert all(r["execution_id"] == out.execution_id for r in reports), reports
    lines = out.text().splitlines()
    assert lines and lines[0] == "line 1", out.text()
    assert set(lines) <= set(ALL_LINES.splitlines()), out.text()
    # In order, none twice (some may be missing until the handover keeps output).
    numbers = [int(line.split()[1]) for line in lines]
    assert numbers == sorted(set(numbers)), f"a line delivered twice: {out.text()!r}"


def run_sync(d: Daemon) -> Tuple[Dict[str, Any], Output, List[Dict[str, Any]], float]:
    out, reports = Output(), []  # type: Output, List[Dict[str, Any]]
    timer = hang_up_later(d)
    t0 = time.monotonic()
    try:
        with Client(d.socket) as c:
            result = c.run(["sh", "-c", LINES], on_output=out, on_start=out.started,
                           on_reconnect=reports.append)
    finally:
        timer.join()
    return result, out, reports, time.monotonic() - t0


def test_run_returns_its_result_once_across_a_handover(own_daemon: Daemon,
                                                       workspace: Path) -> None:
    result, out, reports, took = run_sync(own_daemon)
    check(result, out, reports, took, own_daemon)


def test_async_run_returns_its_result_once_across_a_handover(own_daemon: Daemon,
                                                             workspace: Path) -> None:
    out, reports = Output(), []  # type: Output, List[Dict[str, Any]]

    async def main() -> Dict[str, Any]:
        async with AsyncClient(own_daemon.socket) as c:
            # A second run on the same connection, ending before the handover, and the run
            # across it: the connection is made again once for both.
            short = await c.run(["sh", "-c", "exit 4"])
            assert short["exit"]["code"] == 4
            return await c.run(["sh", "-c", LINES], on_output=out, on_start=out.started,
                               on_reconnect=reports.append)

    timer = hang_up_later(own_daemon)
    t0 = time.monotonic()
    try:
        result = asyncio.run(main())
    finally:
        timer.join()
    check(result, out, reports, time.monotonic() - t0, own_daemon)


def test_gapless_output_across_a_handover(own_daemon: Daemon, workspace: Path) -> None:
    result, out, reports, _ = run_sync(own_daemon)
    assert result["exit"]["code"] == 0, result
    assert out.text() == ALL_LINES
    assert not any(r["gap"] for r in reports), reports
