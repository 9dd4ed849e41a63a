"""The client's own decisions, without a daemon: error typing, the socket rule, and the plan
`run()` builds (the CLI's defaults, docs/cli.md)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from custos import (
    AuthorityError,
    Client,
    CustosError,
    ExecutionError,
    PlanError,
    ProtocolError,
    UnavailableError,
    default_socket_path,
)
from custos._errors import from_rpc_error
from custos._plan import DEFAULT_INHERIT, run_params


def rpc_error(code: str, recovery: str = "caller_correction") -> dict:
    return {"code": -32002, "message": "m",
            "data": {"code": code, "recovery": recovery, "detail": {"context": "c"}}}


@pytest.mark.parametrize(
    "code, cls",
    [("exec.not_found", ExecutionError), ("auth.denied", AuthorityError),
     ("lease.conflict", AuthorityError), ("plan.invalid_cwd", PlanError),
     ("rpc.invalid_params", ProtocolError), ("rpc.unavailable", UnavailableError),
     ("engine.unavailable", CustosError)],
)
def test_errors_are_typed_by_their_stable_code(code: str, cls: type) -> None:
    err = from_rpc_error(rpc_error(code, "reauthorize"))
    assert type(err) is cls and isinstance(err, CustosError)
    assert (err.code, err.recovery, err.detail, err.rpc_code) == (code, "reauthorize",
                                                                 {"context": "c"}, -32002)


def test_the_socket_rule_is_the_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUSTOS_SOCKET", raising=False)
    assert default_socket_path() == "/run/custos/custos.sock"
    (tmp_path / ".custos").mkdir()
    (tmp_path / ".custos" / "custos.sock").write_text("not a socket")
    assert default_socket_path() == "/run/custos/custos.sock"
    (tmp_path / ".custos" / "custos.sock").unlink()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(".custos/custos.sock")
        assert default_socket_path() == str(tmp_path / ".custos" / "custos.sock")
        assert Client().socket_path == str(tmp_path / ".custos" / "custos.sock")
    monkeypatch.setenv("CUSTOS_SOCKET", "/x/y.sock")
    assert default_socket_path() == "/x/y.sock"


def test_no_daemon_is_rpc_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError) as info:
        Client(tmp_path / "absent.sock").host_info()
    assert (info.value.code, info.value.recovery) == ("rpc.unavailable", "preparation_retry")


def params(argv=("sh", "-c", "true"), **kw):  # type: ignore[no-untyped-def]
    options = dict(workspace=None, cwd=None, env=None, timeout=None, clean_env=False,
                   read_only=False, identity=None, lease=None)
    options.update(kw)
    return run_params(argv, **options)


def test_run_defaults_are_the_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LANG", "C.UTF-8")
    p = params()
    plan, ident = p["plan"], p["identity"]
    assert plan["command"]["argv"] == ["sh", "-c", "true"]
    assert os.path.isabs(plan["command"]["executable"])
    assert plan["command"]["executable"].endswith("/sh")
    assert plan["workspace"] == {"root": str(tmp_path), "access": "writable"}
    assert plan["cwd"] == "."
    assert plan["io"] == {"mode": "pipes"} and "limits" not in plan
    inherited = [e["name"] for e in plan["env"]]
    assert inherited == [n for n in DEFAULT_INHERIT if n in os.environ]
    assert all(e.get("inherit") is True for e in plan["env"])
    assert ident["session_id"] == f"cli-{os.getuid()}" and ident["generation"] == 0
    for key in ("project_id", "workspace_id", "resource_id", "environment_id"):
        assert ident[key] == "cli"
    assert p["authority"] == {"epoch": 0, "grant_id": None, "lease_id": None}
    assert params()["identity"]["action_id"] != ident["action_id"]  # a fresh one-use claim


def test_run_options_shape_the_plan(tmp_path: Path) -> None:
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    p = params(workspace=tmp_path, cwd=sub, env={"LANG": "fr", "X": None}, timeout=1.5,
               clean_env=True, read_only=True, identity={"session_id": "s9"}, lease="l1")
    plan = p["plan"]
    assert plan["cwd"] == "a/b" and plan["workspace"]["access"] == "read_only"
    assert plan["env"] == [{"name": "X", "inherit": True}, {"name": "LANG", "value": "fr"}]
    assert plan["limits"] == {"wall_ms": 1500}
    assert p["identity"]["session_id"] == "s9" and p["authority"]["lease_id"] == "l1"


def test_bad_run_input_is_a_typed_error(tmp_path: Path) -> None:
    for bad in ([], "sh", [1]):
        with pytest.raises(PlanError) as info:
            params(argv=bad)
        assert info.value.code == "plan.empty_argv"
    with pytest.raises(PlanError) as info:
        params(argv=["custos-no-such-program-here"])
    assert info.value.code == "plan.invalid_executable"
    with pytest.raises(PlanError):
        params(argv=[str(tmp_path)])  # a directory is no executable
    with pytest.raises(PlanError) as info:
        params(timeout=0)
    assert info.value.code == "plan.invalid_limit"
    with pytest.raises(PlanError):
        params(env={"A": 1})
