#!/usr/bin/env python3
"""An agent's tool-call runner on custos.

For one tool call (a command line) it:
  1. grants authority for exactly that call, as an admin (`authority.grant`, docs/authority.md):
     this user as a runner, the one executable, the workspace read-only, PATH inheritable, one
     execution, a wall-time ceiling;
  2. runs the command under that grant (`run(..., authority=grant_id)`: one exec.start with
     subscribe, the grant checked against the current authority epoch), streaming its output
     line by line with the stream's name;
  3. cancels it (`exec.cancel`) when the agent's deadline passes, and still gets its terminal
     result;
  4. revokes the grant, and prints the outcome as one JSON line.

    agent_runner.py [--socket PATH] [--deadline SECONDS] [--workspace DIR] -- CMD ARG...

Exit status: 0 when the command exited 0, 1 otherwise, 2 when custos refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from typing import Any, Dict, List, Optional

from custos import AsyncClient, CustosError


def printer(prefix: str) -> Any:
    """on_output: writes each stream's lines as they complete, marked with the stream."""
    partial: Dict[str, bytes] = {}

    def on_output(stream: str, data: bytes) -> None:
        *lines, partial[stream] = (partial.get(stream, b"") + data).split(b"\n")
        for line in lines:
            print(f"{prefix}[{stream}] {line.decode(errors='replace')}", flush=True)

    return on_output


async def grant_for(client: AsyncClient, exe: str, workspace: str, deadline: float) -> str:
    granted = await client.authority_grant(
        principal=f"uid:{os.getuid()}",
        role="runner",
        operations=["exec.native"],
        executables=[{"path": exe, "prefix": False}],
        workspaces=[{"workspace_id": "agent", "root": workspace, "max_access": "read_only"}],
        environment_ids=["agent"],
        resource_ids=["agent"],
        inherit_env=["PATH"],
        literal_env=False,
        budget={"executions": 1},
        ceilings={"wall_ms": int(deadline * 1000) + 60_000},
    )
    return str(granted["grant"]["id"])


async def tool_call(
    client: AsyncClient, argv: List[str], workspace: str, deadline: float
) -> Dict[str, Any]:
    found = shutil.which(argv[0])
    if found is None:
        raise SystemExit(f"agent_runner: {argv[0]}: not found in PATH")
    grant = await grant_for(client, os.path.abspath(found), workspace, deadline)
    started: "asyncio.Future[Dict[str, Any]]" = asyncio.get_running_loop().create_future()
    run = asyncio.ensure_future(
        client.run(
            argv,
            workspace=workspace,
            cwd=workspace,
            read_only=True,
            clean_env=True,
            env={"PATH": None},
            timeout=deadline + 60,  # the daemon's own backstop, past the agent's deadline
            authority=grant,
            identity={"session_id": "agent", "workspace_id": "agent",
                      "environment_id": "agent", "resource_id": "agent"},
            on_start=lambda s: started.set_result(s),
            on_output=printer("tool"),
        )
    )
    cancelled: Optional[Dict[str, Any]] = None
    try:
        await asyncio.wait([started, run], return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            execution_id = (await started)["execution_id"]
            try:
                result = await asyncio.wait_for(asyncio.shield(run), deadline)
            except asyncio.TimeoutError:
                cancelled = await client.exec_cancel(execution_id, reason="agent deadline")
                result = await run
        else:
            result = await run
    finally:
        revoked = await client.authority_revoke(grant)
    return {
        "grant": grant,
        "grant_revoked": revoked["grant"].get("revoked"),
        "execution_id": started.result()["execution_id"] if started.done() else None,
        "cancel": cancelled,
        "classification": result["classification"],
        "exit": result["exit"],
    }


async def main(args: argparse.Namespace) -> int:
    workspace = os.path.abspath(args.workspace)
    async with AsyncClient(args.socket) as client:
        try:
            outcome = await tool_call(client, args.command, workspace, args.deadline)
        except CustosError as err:
            print(json.dumps({"error": err.code, "recovery": err.recovery, "detail": err.detail}))
            return 2
    print(json.dumps(outcome), flush=True)
    ok = outcome["classification"] == "exited" and outcome["exit"]["code"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=None, help="the daemon's socket (default: as the CLI)")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds before cancelling")
    parser.add_argument("--workspace", default=".", help="the workspace (read-only; default: .)")
    parser.add_argument("command", nargs="+", help="the tool call: CMD ARG... (after --)")
    sys.exit(asyncio.run(main(parser.parse_args())))
