"""One Python method per method of the daemon's contract (docs/openrpc.json).

Written once for both clients: `_Api[R]` forwards every call to `_request`, which returns the
result for `Client` and an awaitable of it for `AsyncClient`. Method `a.b` is `a_b`; a parameter
whose name is a Python keyword gets a trailing underscore (`lease.release`'s `break` is
`break_`). Optional parameters are keyword-only and left out of the request when None, so the
daemon applies its own default. tests/test_contract.py checks this file against openrpc.json.
"""

from __future__ import annotations

from typing import Any, Dict, Generic, List, Mapping, Optional, Sequence, TypeVar

from ._plan import Authority, PathLike, authority_grant, prepare_run
from ._run import OutputCallback, ReconnectCallback, StartCallback, Steps, run_steps

_R = TypeVar("_R")

Json = Mapping[str, Any]


def _params(**given: Any) -> Dict[str, Any]:
    return {name.rstrip("_"): value for name, value in given.items() if value is not None}


class _Api(Generic[_R]):
    def _request(self, method: str, params: Dict[str, Any]) -> _R:
        raise NotImplementedError

    def _drive(self, steps: Steps) -> _R:
        raise NotImplementedError

    def call(self, method: str, /, **params: Any) -> _R:
        """Sends any method by name with its params; returns its result."""
        return self._request(method, params)

    def run(
        self,
        argv: Sequence[str],
        *,
        workspace: Optional[PathLike] = None,
        cwd: Optional[PathLike] = None,
        env: Optional[Mapping[str, Optional[str]]] = None,
        timeout: Optional[float] = None,
        on_output: Optional[OutputCallback] = None,
        on_start: Optional[StartCallback] = None,
        on_reconnect: Optional[ReconnectCallback] = None,
        input: Optional[bytes] = None,  # noqa: A002 - as subprocess.run
        authority: Optional[Authority] = None,
        lease: Optional[str] = None,
        identity: Optional[Json] = None,
        clean_env: bool = False,
        read_only: bool = False,
    ) -> _R:
        """Runs one command as an owned execution, as `custos run` does, and returns its
        terminal result (a dict). One exec.start with subscribe; output reaches `on_output`
        (stream, bytes) as it arrives, every byte once, in order. Across a daemon handover the
        run reconnects and resumes its events; `on_reconnect` hears of each reconnect (a gap
        without it is a ReconnectGapWarning). See the README."""
        options = dict(workspace=workspace, cwd=cwd, env=env, timeout=timeout,
                       clean_env=clean_env, read_only=read_only, identity=identity, lease=lease)
        params = prepare_run(argv, authority, options)
        return self._drive(run_steps(params, grant=authority_grant(authority), input=input,
                                     on_output=on_output, on_start=on_start,
                                     on_reconnect=on_reconnect))

    # -- host
    def host_info(self) -> _R:
        """Daemon version, boot id, capabilities, default boundary, policies, recovery findings."""
        return self._request("host.info", {})

    def host_gc(self) -> _R:
        """Retry unfinished output publications, then apply the retention policy (admins)."""
        return self._request("host.gc", {})

    # -- executions
    def exec_check(
        self,
        identity: Json,
        plan: Json,
        *,
        authority: Optional[Json] = None,
        subscribe: Optional[bool] = None,
    ) -> _R:
        """Dry run of exec.start: validate, digest and admit; no effect."""
        return self._request(
            "exec.check",
            _params(identity=identity, plan=plan, authority=authority, subscribe=subscribe),
        )

    def exec_start(
        self,
        identity: Json,
        plan: Json,
        *,
        authority: Optional[Json] = None,
        subscribe: Optional[bool] = None,
    ) -> _R:
        """Launch one owned execution. With subscribe=True its events follow on this connection
        (read them with next_event); `run` does all of that for one command."""
        return self._request(
            "exec.start",
            _params(identity=identity, plan=plan, authority=authority, subscribe=subscribe),
        )

    def exec_get(self, execution_id: str) -> _R:
        """One execution record."""
        return self._request("exec.get", _params(execution_id=execution_id))

    def exec_list(
        self,
        *,
        phase: Optional[str] = None,
        session_id: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> _R:
        """Executions, newest first (`executions`, `next_cursor`)."""
        return self._request(
            "exec.list", _params(phase=phase, session_id=session_id, limit=limit, cursor=cursor)
        )

    def exec_wait(self, execution_id: str, *, timeout_ms: Optional[int] = None) -> _R:
        """The terminal result, once there is one (`exec.wait_timeout` past timeout_ms)."""
        return self._request(
            "exec.wait", _params(execution_id=execution_id, timeout_ms=timeout_ms)
        )

    def exec_cancel(
        self, execution_id: str, *, reason: Optional[str] = None, force: Optional[bool] = None
    ) -> _R:
        """Offer the user cancellation trigger (`accepted`, `trigger`, `forced`); `force` skips
        what is left of the graceful stop: the tree is killed now."""
        return self._request(
            "exec.cancel", _params(execution_id=execution_id, reason=reason, force=force)
        )

    def exec_input(
        self,
        execution_id: str,
        *,
        data_b64: Optional[str] = None,
        eof: Optional[bool] = None,
    ) -> _R:
        """Write base64 data to the execution's stdin (or terminal); eof=True closes it."""
        return self._request(
            "exec.input", _params(execution_id=execution_id, data_b64=data_b64, eof=eof)
        )

    def exec_resize(self, execution_id: str, rows: int, cols: int) -> _R:
        """Resize the execution's pseudo-terminal."""
        return self._request(
            "exec.resize", _params(execution_id=execution_id, rows=rows, cols=cols)
        )

    def exec_subscribe(self, execution_id: str, *, from_seq: Optional[int] = None) -> _R:
        """exec.event notifications of an execution on this connection (read with next_event)."""
        return self._request(
            "exec.subscribe", _params(execution_id=execution_id, from_seq=from_seq)
        )

    def exec_unsubscribe(self, subscription: str) -> _R:
        """Stop a subscription of this connection."""
        return self._request("exec.unsubscribe", _params(subscription=subscription))

    def exec_output(
        self,
        execution_id: str,
        stream: str,
        *,
        offset: Optional[int] = None,
        max_bytes: Optional[int] = None,
    ) -> _R:
        """Read a stream (`stdout`, `stderr`, `pty`) from its spool file (`data_b64`, `eof`)."""
        return self._request(
            "exec.output",
            _params(execution_id=execution_id, stream=stream, offset=offset, max_bytes=max_bytes),
        )

    # -- authority (docs/authority.md)
    def authority_grant(
        self,
        principal: str,
        *,
        id: Optional[str] = None,  # noqa: A002 - the contract's name
        role: Optional[str] = None,
        operations: Optional[Sequence[str]] = None,
        executables: Optional[Sequence[Json]] = None,
        workspaces: Optional[Sequence[Json]] = None,
        containers: Optional[Sequence[Json]] = None,
        environment_ids: Optional[Sequence[str]] = None,
        resource_ids: Optional[Sequence[str]] = None,
        inherit_env: Optional[Sequence[str]] = None,
        literal_env: Optional[bool] = None,
        run_as_uids: Optional[Sequence[int]] = None,
        ceilings: Optional[Json] = None,
        budget: Optional[Json] = None,
        sandbox: Optional[Json] = None,
        expires_ns: Optional[int] = None,
    ) -> _R:
        """Create a grant (admins only): `grant`, `epoch`."""
        return self._request(
            "authority.grant",
            _params(
                principal=principal,
                id=id,
                role=role,
                operations=_list(operations),
                executables=_list(executables),
                workspaces=_list(workspaces),
                containers=_list(containers),
                environment_ids=_list(environment_ids),
                resource_ids=_list(resource_ids),
                inherit_env=_list(inherit_env),
                literal_env=literal_env,
                run_as_uids=_list(run_as_uids),
                ceilings=ceilings,
                budget=budget,
                sandbox=sandbox,
                expires_ns=expires_ns,
            ),
        )

    def authority_revoke(self, grant_id: str) -> _R:
        """Revoke a grant and fence the executions using it (admins only)."""
        return self._request("authority.revoke", _params(grant_id=grant_id))

    def authority_list(
        self, *, grant_id: Optional[str] = None, principal: Optional[str] = None
    ) -> _R:
        """Grants with their budget use, and the authority `epoch`."""
        return self._request(
            "authority.list", _params(grant_id=grant_id, principal=principal)
        )

    def lease_acquire(self, workspace_id: str, holder_session: str) -> _R:
        """Acquire the writable lease of a workspace."""
        return self._request(
            "lease.acquire", _params(workspace_id=workspace_id, holder_session=holder_session)
        )

    def lease_release(self, lease_id: str, *, break_: Optional[bool] = None) -> _R:
        """Release a lease (its holder) or break it (break_=True, admins)."""
        return self._request("lease.release", _params(lease_id=lease_id, break_=break_))

    def lease_list(self, *, active_only: Optional[bool] = None) -> _R:
        """Leases (active ones unless active_only=False)."""
        return self._request("lease.list", _params(active_only=active_only))

    def holder_quiescence(
        self, session_id: str, generation: int, *, actor: Optional[str] = None
    ) -> _R:
        """Evidence that a holder has no live or unresolved execution, or what blocks it."""
        return self._request(
            "holder.quiescence",
            _params(session_id=session_id, generation=generation, actor=actor),
        )

    # -- secrets (admins only)
    def secret_set(self, name: str, value_b64: str) -> _R:
        """Store a secret's value (padded base64) under a name."""
        return self._request("secret.set", _params(name=name, value_b64=value_b64))

    def secret_list(self) -> _R:
        """The names the secret store holds, never their values."""
        return self._request("secret.list", {})

    def secret_delete(self, name: str) -> _R:
        """Delete a secret from the store."""
        return self._request("secret.delete", _params(name=name))


def _list(items: Optional[Sequence[Any]]) -> Optional[List[Any]]:
    return None if items is None else list(items)
