"""The AsyncClient against a live daemon: the same calls awaited, and concurrent runs sharing
one connection."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Tuple

import pytest

from conftest import Daemon
from custos import AsyncClient, ExecutionError, UnavailableError


def arun(body: Callable[[AsyncClient], Awaitable[Any]], socket_path: str) -> Any:
    async def main() -> Any:
        async with AsyncClient(socket_path) as client:
            return await body(client)

    return asyncio.run(main())


class Collected:
    def __init__(self) -> None:
        self.chunks: List[Tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    def of(self, stream: str) -> bytes:
        return b"".join(d for s, d in self.chunks if s == stream)


def test_host_info(socket_path: str, daemon: Daemon) -> None:
    info = arun(lambda c: c.host_info(), socket_path)
    assert info["pid"] == daemon.proc.pid  # type: ignore[union-attr]


def test_run_streams_large_output_exactly(socket_path: str, workspace: Path) -> None:
    (workspace / "big").write_bytes(os.urandom(2 * 1024 * 1024 + 3))
    out = Collected()
    r = arun(lambda c: c.run(["sh", "-c", "cat big; printf tail >&2"], on_output=out),
             socket_path)
    assert r["classification"] == "exited"
    assert out.of("stdout") == (workspace / "big").read_bytes() and out.of("stderr") == b"tail"


def test_exit_code_timeout_and_errors(socket_path: str, workspace: Path) -> None:
    async def body(c: AsyncClient) -> None:
        r = await c.run(["sh", "-c", "exit 7"])
        assert (r["classification"], r["exit"]["code"]) == ("exited", 7)
        r = await c.run(["sleep", "30"], timeout=0.5)
        assert r["classification"] == "timed_out"
        with pytest.raises(ExecutionError) as info:
            await c.exec_wait("ex-missing")
        assert (info.value.code, info.value.recovery) == ("exec.not_found", "caller_correction")

    arun(body, socket_path)


def test_cancel_on_the_same_connection(socket_path: str, workspace: Path) -> None:
    async def body(c: AsyncClient) -> Dict[str, Any]:
        started: "asyncio.Future[Dict[str, Any]]" = asyncio.get_running_loop().create_future()
        run = asyncio.ensure_future(c.run(["sleep", "30"], on_start=started.set_result))
        answer = await c.exec_cancel((await started)["execution_id"], reason="test")
        assert answer["accepted"] is True
        return await run

    began = time.monotonic()
    assert arun(body, socket_path)["classification"] == "cancelled"
    assert time.monotonic() - began < 20


def test_concurrent_runs_share_one_connection(socket_path: str, workspace: Path) -> None:
    n = 6

    async def body(c: AsyncClient) -> List[Tuple[Dict[str, Any], Collected]]:
        outs = [Collected() for _ in range(n)]
        runs = [c.run(["sh", "-c", f"for k in 1 2 3; do echo run{i}-$k; sleep 0.1; done; exit {i}"],
                      on_output=outs[i]) for i in range(n)]
        info, *results = await asyncio.gather(c.host_info(), *runs)
        assert info["pid"] > 0
        return list(zip(results, outs))

    for i, (r, out) in enumerate(arun(body, socket_path)):
        assert (r["classification"], r["exit"]["code"]) == ("exited", i)
        assert out.of("stdout") == "".join(f"run{i}-{k}\n" for k in (1, 2, 3)).encode()


def test_call_and_events(socket_path: str, workspace: Path) -> None:
    async def body(c: AsyncClient) -> None:
        assert "exec.start" in (await c.call("rpc.methods"))["methods"]
        out = Collected()
        r = await c.run(["echo", "hi"], on_start=lambda s: out("id", s["execution_id"].encode()))
        listed = await c.call("exec.list", limit=50)
        assert out.of("id").decode() in {e["execution_id"] for e in listed["executions"]}
        sub = await c.exec_subscribe(out.of("id").decode(), from_seq=1)
        kinds: List[str] = []
        while not kinds or kinds[-1] != "terminal":
            event = await c.next_event(sub["subscription"], timeout=30)
            assert event is not None
            kinds.append(event["kind"])
        assert kinds[0] == "started" and r["classification"] == "exited"
        assert await c.next_event(timeout=0.1) is None

    arun(body, socket_path)


def test_no_daemon_is_rpc_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError) as info:
        arun(lambda c: c.host_info(), str(tmp_path / "absent.sock"))
    assert info.value.code == "rpc.unavailable"


def test_a_slow_reader_still_gets_every_byte_once(socket_path: str, workspace: Path) -> None:
    # A callback that blocks the event loop stops the reader task too: the daemon drops events
    # past its 1 MiB event queue, and run() reads their bytes back with exec.output.
    data = os.urandom(16 * 1024 * 1024)
    (workspace / "big").write_bytes(data)
    got: List[bytes] = []
    methods: List[str] = []

    def slow(stream: str, chunk: bytes) -> None:
        if not got:
            time.sleep(3)
        got.append(chunk)

    async def body(c: AsyncClient) -> Dict[str, Any]:
        real = c._call

        async def spy(method: str, params: Dict[str, Any]) -> Any:
            methods.append(method)
            return await real(method, params)

        c._call = spy  # type: ignore[assignment]
        return await c.run(["cat", "big"], on_output=slow)

    assert arun(body, socket_path)["classification"] == "exited"
    assert b"".join(got) == data and "exec.output" in methods


def test_close_wakes_an_event_waiter(socket_path: str, workspace: Path) -> None:
    async def body(c: AsyncClient) -> None:
        waiter = asyncio.ensure_future(c.next_event("no-such-subscription"))
        await asyncio.sleep(0.1)
        await c.close()
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(waiter, 10)
        assert (await c.host_info())["pid"] > 0  # a closed client connects again

    arun(body, socket_path)
