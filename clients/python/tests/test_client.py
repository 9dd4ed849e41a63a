"""The blocking Client against a live daemon."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from conftest import IDLE_TIMEOUT_MS, INHERITED_NAME, INHERITED_VALUE, Daemon
from custos import Client, CustosError, ExecutionError, PlanError, ProtocolError


class Collected:
    """on_output's calls: the chunks in order, and the bytes per stream."""

    def __init__(self) -> None:
        self.chunks: List[Tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        assert isinstance(data, bytes) and data
        self.chunks.append((stream, data))

    def of(self, stream: str) -> bytes:
        return b"".join(d for s, d in self.chunks if s == stream)


def test_host_info(client: Client, daemon: Daemon) -> None:
    info = client.host_info()
    assert info["pid"] == daemon.proc.pid  # type: ignore[union-attr]
    assert isinstance(info["version"], str) and info["boot_id"]


def test_run_streams_stdout_and_stderr(client: Client, workspace: Path) -> None:
    out = Collected()
    result = client.run(["sh", "-c", "printf out1; printf err1 >&2; sleep 0.2; printf out2"],
                        workspace=workspace, on_output=out)
    assert result["classification"] == "exited"
    assert result["exit"] == {"code": 0, "signal": None}
    assert out.of("stdout") == b"out1out2" and out.of("stderr") == b"err1"
    assert result["output"]["stdout"]["observed"] == 8 and result["digest"].startswith("sha256:")


def test_output_arrives_while_the_program_runs(client: Client, workspace: Path) -> None:
    seen: List[float] = []
    started = time.monotonic()

    def on_output(stream: str, data: bytes) -> None:
        seen.append(time.monotonic() - started)

    client.run(["sh", "-c", "echo first; sleep 1.5; echo second"], workspace=workspace,
               on_output=on_output)
    assert len(seen) == 2 and seen[1] - seen[0] > 1.0  # the first came before the second existed


def test_large_output_is_exact(client: Client, workspace: Path) -> None:
    (workspace / "big.out").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (workspace / "big.err").write_bytes(os.urandom(1536 * 1024 + 5))
    out = Collected()
    result = client.run(["sh", "-c", "cat big.out; cat big.err >&2"], workspace=workspace,
                        on_output=out)
    assert result["classification"] == "exited"
    assert out.of("stdout") == (workspace / "big.out").read_bytes()
    assert out.of("stderr") == (workspace / "big.err").read_bytes()


def test_a_slow_reader_still_gets_every_byte_once(
    client: Client, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stalling on the first chunk lets the daemon's event queue for this connection (1 MiB)
    # overflow while the first `cat` runs: its events are dropped. The second `cat`'s events,
    # after the stall, arrive with offsets past what was delivered: run() reads the gap back
    # with exec.output by offset before delivering them (the async suite covers a gap at the
    # end, read back after the terminal event).
    data = os.urandom(8 * 1024 * 1024)
    (workspace / "big").write_bytes(data)
    calls: List[str] = []
    real = client._request

    def spy(method: str, params: Dict[str, Any]) -> Any:
        calls.append(method)
        return real(method, params)

    real_event = client.next_event

    def spy_event(*args: Any, **kwargs: Any) -> Any:
        event = real_event(*args, **kwargs)
        calls.append(f"event:{event['kind']}" if event else "event:none")
        return event

    monkeypatch.setattr(client, "_request", spy)
    monkeypatch.setattr(client, "next_event", spy_event)
    got: List[bytes] = []

    def slow(stream: str, chunk: bytes) -> None:
        if not got:
            time.sleep(3)
        got.append(chunk)

    result = client.run(["sh", "-c", "cat big; sleep 5; cat big"], on_output=slow)
    assert result["classification"] == "exited"
    assert b"".join(got) == data + data
    assert calls[0] == "exec.start"
    assert {c for c in calls if not c.startswith("event:")} == {"exec.start", "exec.output"}
    # A gap was read back while events were still coming, not only after the terminal one.
    first_fill = calls.index("exec.output")
    assert "event:output" in calls[first_fill:]


def test_exit_codes_and_signals(client: Client, workspace: Path) -> None:
    r = client.run(["sh", "-c", "exit 3"], workspace=workspace)
    assert (r["classification"], r["exit"]["code"]) == ("exited", 3)
    r = client.run(["sh", "-c", "kill -9 $$"], workspace=workspace)
    assert (r["classification"], r["exit"]["signal"]) == ("signaled", 9)


def test_timeout_is_timed_out(client: Client, workspace: Path) -> None:
    started = time.monotonic()
    r = client.run(["sleep", "30"], workspace=workspace, timeout=0.5)
    assert r["classification"] == "timed_out"
    assert time.monotonic() - started < 20


def test_cancel_from_another_connection(client: Client, socket_path: str, workspace: Path) -> None:
    answers: List[Dict[str, Any]] = []

    def cancel_soon(started: Dict[str, Any]) -> None:
        def cancel() -> None:
            with Client(socket_path) as other:
                answers.append(other.exec_cancel(started["execution_id"], reason="test"))

        threading.Timer(0.3, cancel).start()

    r = client.run(["sleep", "30"], workspace=workspace, on_start=cancel_soon)
    assert r["classification"] == "cancelled" and r["trigger"] == "user"
    assert answers and answers[0]["accepted"] is True


def test_cancel_from_the_runs_own_callback(client: Client, workspace: Path) -> None:
    ids: List[str] = []

    def on_output(stream: str, data: bytes) -> None:
        if not ids[1:]:
            ids.append("sent")
            client.exec_cancel(ids[0], reason="seen enough")  # the same connection, mid-run

    r = client.run(["sh", "-c", "echo go; sleep 30"], workspace=workspace, on_output=on_output,
                   on_start=lambda s: ids.append(s["execution_id"]))
    assert r["classification"] == "cancelled"


def test_errors_carry_code_and_recovery(client: Client) -> None:
    with pytest.raises(ExecutionError) as info:
        client.exec_get("ex-no-such-execution")
    err = info.value
    assert (err.code, err.recovery) == ("exec.not_found", "caller_correction")
    assert isinstance(err, CustosError) and err.rpc_code == -32002
    with pytest.raises(ProtocolError) as perr:
        client.call("no.such_method")
    assert perr.value.code == "rpc.method_not_found"
    with pytest.raises(ProtocolError) as perr:
        client.call("exec.get", execution_id=5)
    assert perr.value.code == "rpc.invalid_params"
    # The connection stays usable after errors.
    assert client.host_info()["pid"] > 0


def test_invalid_plan_reports_every_problem(client: Client, workspace: Path) -> None:
    ids = ("project_id", "session_id", "run_id", "attempt_id", "turn_id", "action_id",
           "process_id", "workspace_id", "resource_id", "environment_id")
    identity: Dict[str, Any] = {k: "x" for k in ids}
    identity.update(generation=0, revision=0)
    plan = {"command": {"executable": "rel/path", "argv": ["a"]},
            "workspace": {"root": str(workspace)}, "cwd": "../out"}
    with pytest.raises(PlanError) as info:
        client.exec_start(identity, plan)
    pointers = {d["pointer"] for d in info.value.diagnostics}
    assert {"/plan/command/executable", "/plan/cwd"} <= pointers


def test_env_and_cwd(client: Client, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    out = Collected()
    r = client.run(
        ["sh", "-c", f'pwd; echo "$LIT"; echo "${INHERITED_NAME}"; echo "${{HOME-unset}}"'],
        workspace=workspace, cwd=workspace / "sub", clean_env=True,
        env={"LIT": "a value", INHERITED_NAME: None}, on_output=out)
    assert r["classification"] == "exited"
    lines = out.of("stdout").decode().splitlines()
    assert lines == [str(workspace / "sub"), "a value", INHERITED_VALUE, "unset"]


def test_a_cwd_outside_the_workspace_is_refused(client: Client, workspace: Path) -> None:
    with pytest.raises(PlanError) as info:
        client.run(["true"], workspace=workspace / "..", cwd="/")  # a .. path after all
    assert info.value.code.startswith("plan.")


def test_input_reaches_stdin(client: Client, workspace: Path) -> None:
    out = Collected()
    payload = os.urandom(700 * 1024)  # more than one exec.input chunk
    r = client.run(["cat"], workspace=workspace, input=payload, on_output=out)
    assert r["classification"] == "exited" and out.of("stdout") == payload


def test_call_is_generic(client: Client) -> None:
    assert client.call("host.info")["pid"] == client.host_info()["pid"]
    assert "exec.start" in client.call("rpc.methods")["methods"]
    listed = client.call("exec.list", limit=2)
    assert len(listed["executions"]) <= 2 and "next_cursor" in listed


def test_raw_start_subscribe_and_wait(client: Client, workspace: Path) -> None:
    params = {"identity": {"project_id": "p", "session_id": "raw", "run_id": "r",
                           "attempt_id": "a", "turn_id": "t", "action_id": os.urandom(8).hex(),
                           "process_id": "p1", "workspace_id": "w", "resource_id": "r",
                           "environment_id": "e", "generation": 0, "revision": 0},
              "plan": {"command": {"executable": "/bin/echo", "argv": ["echo", "raw"]},
                       "workspace": {"root": str(workspace)}}}
    started = client.exec_start(params["identity"], params["plan"], subscribe=True)
    kinds: List[str] = []
    while not kinds or kinds[-1] != "terminal":
        event = client.next_event(started["subscription"], timeout=30)
        assert event is not None and event["execution_id"] == started["execution_id"]
        kinds.append(event["kind"])
    assert kinds[0] == "started" and "output" in kinds
    assert client.exec_wait(started["execution_id"])["classification"] == "exited"
    assert client.next_event(timeout=0.1) is None
    got = client.exec_output(started["execution_id"], "stdout")
    assert got["data_b64"] == "cmF3Cg=="


def test_a_connection_closed_for_idleness_is_made_again(client: Client) -> None:
    first = client.host_info()
    time.sleep(IDLE_TIMEOUT_MS / 1000 + 1)
    assert client.host_info()["pid"] == first["pid"]
