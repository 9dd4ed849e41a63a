"""What `custos run` decides on the caller's side, for `run()`: the socket, the executable, the
workspace and cwd, the identity and the environment (docs/cli.md, src/cli/cmd_run.cpp)."""

from __future__ import annotations

import os
import secrets
import stat
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._errors import PlanError

PathLike = Union[str, "os.PathLike[str]"]
#: A grant id, or the whole `authority` object of exec.start (docs/authority.md).
Authority = Union[str, Mapping[str, Any]]

#: Names inherited by default so ordinary programs find their tools and locale (as the CLI).
DEFAULT_INHERIT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM")


def default_socket_path() -> str:
    """The CLI's rule: `$CUSTOS_SOCKET`, else `./.custos/custos.sock` when it exists (made
    absolute), else `/run/custos/custos.sock`."""
    env = os.environ.get("CUSTOS_SOCKET")
    if env:
        return env
    local = os.path.join(".custos", "custos.sock")
    try:
        if stat.S_ISSOCK(os.stat(local).st_mode):
            return os.path.join(os.getcwd(), local)
    except OSError:
        pass
    return "/run/custos/custos.sock"


def plan_error(code: str, message: str) -> PlanError:
    return PlanError(message, code=code, recovery="caller_correction", detail={"context": message})


def _is_executable_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode) and os.access(path, os.X_OK)
    except OSError:
        return False


def resolve_executable(name: str) -> str:
    """A bare name is looked up in the caller's PATH like execvp would; a name with '/' is taken
    relative to the current directory. The plan gets the absolute path; argv[0] stays as given."""
    if not name:
        raise plan_error("plan.invalid_executable", "empty command")
    if "/" in name:
        path = os.path.abspath(name)
        if not _is_executable_file(path):
            raise plan_error("plan.invalid_executable", f"{path} is not an executable file")
        return path
    search = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    for folder in search.split(":"):
        candidate = os.path.abspath(os.path.join(folder or ".", name))
        if _is_executable_file(candidate):
            return candidate
    raise plan_error("plan.invalid_executable", f"{name}: not found in PATH")


def plan_env(env: Optional[Mapping[str, Optional[str]]], clean_env: bool) -> List[Dict[str, Any]]:
    """The plan's environment, built from nothing: the default names the caller has set are
    inherited (unless clean_env), then `env`'s names mapped to None are inherited and those mapped
    to a string are literals; a literal wins over a default inheritance of the same name. An
    inherited name gets the daemon's value: no value travels from here."""
    given = dict(env or {})
    for name, value in given.items():
        if not isinstance(name, str) or not (value is None or isinstance(value, str)):
            raise plan_error(
                "plan.invalid_env_name", f"env: {name!r} must map a name to a str or None"
            )
    out: List[Dict[str, Any]] = []
    seen = set()

    def add(entry: Dict[str, Any]) -> None:
        if entry["name"] not in seen:
            seen.add(entry["name"])
            out.append(entry)

    if not clean_env:
        for name in DEFAULT_INHERIT:
            if name in os.environ and given.get(name, None) is None:
                add({"name": name, "inherit": True})
    for name, value in given.items():
        if value is None:
            add({"name": name, "inherit": True})
    for name, value in given.items():
        if value is not None:
            add({"name": name, "value": value})
    return out


def run_params(
    argv: Sequence[str],
    *,
    workspace: Optional[PathLike],
    cwd: Optional[PathLike],
    env: Optional[Mapping[str, Optional[str]]],
    timeout: Optional[float],
    clean_env: bool,
    read_only: bool,
    identity: Optional[Mapping[str, Any]],
    lease: Optional[str],
) -> Dict[str, Any]:
    """exec.start's params for `run()`, as `custos run` builds them (without `subscribe`)."""
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise plan_error("plan.empty_argv", "argv must be a non-empty sequence of str")
    exe = resolve_executable(argv[0])
    here = os.getcwd()
    root = os.path.abspath(os.fspath(workspace)) if workspace is not None else here
    where = os.path.abspath(os.fspath(cwd)) if cwd is not None else here
    # A cwd outside the workspace becomes a '..' path the daemon refuses (plan.invalid_cwd).
    rel = os.path.relpath(where, root)
    plan: Dict[str, Any] = {
        "command": {"executable": exe, "argv": list(argv)},
        "workspace": {"root": root, "access": "read_only" if read_only else "writable"},
        "cwd": rel,
        "env": plan_env(env, clean_env),
        "io": {"mode": "pipes"},
    }
    if timeout is not None:
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise plan_error("plan.invalid_limit", f"timeout must be positive seconds: {timeout!r}")
        plan["limits"] = {"wall_ms": max(1, int(timeout * 1000))}
    ident: Dict[str, Any] = {
        "project_id": "cli",
        "session_id": f"cli-{os.getuid()}",
        "run_id": "run-" + secrets.token_hex(8),
        "attempt_id": "a1",
        "turn_id": "t1",
        "action_id": "act-" + secrets.token_hex(8),
        "process_id": "proc-1",
        "workspace_id": "cli",
        "resource_id": "cli",
        "environment_id": "cli",
        "generation": 0,
        "revision": 0,
    }
    ident.update(identity or {})
    return {
        "identity": ident,
        "plan": plan,
        "authority": {"epoch": 0, "grant_id": None, "lease_id": lease},
    }



def authority_grant(authority: Optional[Authority]) -> Optional[str]:
    return authority if isinstance(authority, str) else None


def prepare_run(
    argv: Sequence[str],
    authority: Optional[Authority],
    options: Dict[str, Any],
) -> Dict[str, Any]:
    """exec.start's params for run(): a grant id is resolved by run_steps; a mapping is the
    authority object itself (docs/authority.md)."""
    params = run_params(argv, **options)
    if isinstance(authority, Mapping):
        params["authority"] = dict(authority)
    elif authority is not None and not isinstance(authority, str):
        raise plan_error(
            "plan.wrong_type", "authority must be a grant id (str) or an authority object"
        )
    return params
