"""examples/agent_runner.py run for real: it grants, runs under the grant, streams, cancels on
its deadline and revokes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from custos import AuthorityError, Client

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agent_runner.py"


def agent(
    socket_path: str, workspace: Path, deadline: float, *argv: str
) -> Tuple[int, List[str], Dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--socket", socket_path, "--deadline", str(deadline),
         "--workspace", str(workspace), "--", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, cwd=str(workspace),
    )
    lines = proc.stdout.decode().splitlines()
    assert lines, proc.stderr.decode()
    return proc.returncode, lines[:-1], json.loads(lines[-1])


def test_the_agent_streams_and_cancels_on_its_deadline(socket_path: str, workspace: Path) -> None:
    began = time.monotonic()
    code, lines, outcome = agent(socket_path, workspace, 1.0,
                                 "sh", "-c", "echo started; echo to-stderr >&2; sleep 30")
    assert time.monotonic() - began < 25
    assert sorted(lines) == ["tool[stderr] to-stderr", "tool[stdout] started"]
    assert outcome["classification"] == "cancelled" and code == 1
    assert outcome["cancel"]["accepted"] is True and outcome["grant_revoked"] is True
    with Client(socket_path) as c:
        record = c.exec_get(outcome["execution_id"])
        assert record["terminal"]["trigger"] == "user"
        grant = c.authority_list(grant_id=outcome["grant"])["grants"][0]
        assert grant["revoked"] is True and grant["principal"] == f"uid:{os.getuid()}"


def test_the_agent_runs_a_call_that_finishes_in_time(socket_path: str, workspace: Path) -> None:
    code, lines, outcome = agent(socket_path, workspace, 30.0, "sh", "-c", "echo done; pwd")
    assert code == 0 and outcome["classification"] == "exited" and outcome["cancel"] is None
    assert lines == ["tool[stdout] done", f"tool[stdout] {workspace}"]


def test_the_grant_binds_the_run(socket_path: str, workspace: Path) -> None:
    # The example's grant allows one executable: the run under it is authorized by the grant
    # (its budget counts one execution), and a second run under the same grant is refused.
    with Client(socket_path) as c:
        granted = c.authority_grant(
            f"uid:{os.getuid()}", role="runner", operations=["exec.native"],
            executables=[{"path": "/bin/echo", "prefix": False}],
            workspaces=[{"workspace_id": "agent", "root": str(workspace),
                         "max_access": "read_only"}],
            environment_ids=["agent"], resource_ids=["agent"], budget={"executions": 1})
        grant = granted["grant"]["id"]
        ident = {"workspace_id": "agent", "environment_id": "agent", "resource_id": "agent"}
        r = c.run(["/bin/echo", "x"], authority=grant, read_only=True, clean_env=True,
                  identity=ident)
        assert r["classification"] == "exited"
        with pytest.raises(AuthorityError) as info:
            c.run(["/bin/echo", "y"], authority=grant, read_only=True, clean_env=True,
                  identity=ident)
        assert (info.value.code, info.value.recovery) == ("auth.budget_exhausted", "reauthorize")
        c.authority_revoke(grant)
