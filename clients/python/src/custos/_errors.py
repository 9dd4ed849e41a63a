"""Typed errors: every daemon error, and every failure to reach the daemon, is a CustosError.

The daemon puts `{"code", "recovery", "detail"}` in every JSON-RPC error's `data`
(docs/api.md, "Errors carry a stable code"). Clients branch on `code`, never on the JSON-RPC
number, so the subclasses below are chosen by the code's prefix.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Type


class CustosError(Exception):
    """An error from the daemon, or from talking to it.

    `code` is the stable string code (`auth.denied`, `exec.not_found`, ...), `recovery` the
    recovery class (`caller_correction`, `reauthorize`, `preparation_retry`, ...), `detail` the
    error's detail object (`context`, `errno`, `diagnostics`, `missing`, ... as the daemon sent
    them), and `rpc_code` the JSON-RPC error number (None for errors raised by the client).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        recovery: str,
        detail: Optional[Mapping[str, Any]] = None,
        rpc_code: Optional[int] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.message = message
        self.code = code
        self.recovery = recovery
        self.detail: Dict[str, Any] = dict(detail or {})
        self.rpc_code = rpc_code

    @property
    def diagnostics(self) -> List[Dict[str, Any]]:
        """`detail.diagnostics`: `[{code, pointer, message}]` for validation errors, else []."""
        found = self.detail.get("diagnostics")
        return list(found) if isinstance(found, list) else []


class UnavailableError(CustosError):
    """No daemon answers on the socket, or the connection to it was lost (`rpc.unavailable`)."""


class ProtocolError(CustosError):
    """The JSON-RPC exchange itself failed: `rpc.parse_error`, `rpc.invalid_request`,
    `rpc.method_not_found`, `rpc.invalid_params`, `rpc.line_too_long`, or a reply the client
    could not read."""


class PlanError(CustosError):
    """The identity or plan is invalid (`plan.*`, `identity.*`, `canonical.*`)."""


class ExecutionError(CustosError):
    """An execution call failed (`exec.*`: `exec.not_found`, `exec.wait_timeout`, ...)."""


class AuthorityError(CustosError):
    """Refused by the authority (`auth.*`, `lease.*`)."""


class SandboxError(CustosError):
    """A sandbox or secret-store refusal (`sandbox.*`, `secret.*`)."""


_BY_PREFIX: Dict[str, Type[CustosError]] = {
    "plan": PlanError,
    "identity": PlanError,
    "canonical": PlanError,
    "exec": ExecutionError,
    "auth": AuthorityError,
    "lease": AuthorityError,
    "sandbox": SandboxError,
    "secret": SandboxError,
}

_PROTOCOL_CODES = frozenset(
    {
        "rpc.parse_error",
        "rpc.invalid_request",
        "rpc.method_not_found",
        "rpc.invalid_params",
        "rpc.line_too_long",
    }
)


def error_class(code: str) -> Type[CustosError]:
    """The CustosError subclass for a stable code."""
    if code == "rpc.unavailable":
        return UnavailableError
    if code in _PROTOCOL_CODES:
        return ProtocolError
    return _BY_PREFIX.get(code.split(".", 1)[0], CustosError)


def from_rpc_error(error: Any) -> CustosError:
    """The typed error for a JSON-RPC `error` object from the daemon."""
    if not isinstance(error, dict):
        return protocol_error(f"malformed error object: {error!r}")
    data = error.get("data")
    data = data if isinstance(data, dict) else {}
    code = data.get("code")
    rpc_code = error.get("code")
    message = error.get("message")
    detail = data.get("detail")
    if not isinstance(code, str):
        # Only a daemon that breaks its own contract omits the stable code.
        code = "rpc.invalid_request"
    recovery = data.get("recovery")
    return error_class(code)(
        message if isinstance(message, str) else "",
        code=code,
        recovery=recovery if isinstance(recovery, str) else "caller_correction",
        detail=detail if isinstance(detail, dict) else None,
        rpc_code=rpc_code if isinstance(rpc_code, int) else None,
    )


def unavailable(message: str, errno: Optional[int] = None) -> UnavailableError:
    """The CLI's `rpc.unavailable`: nothing answers, or the connection is gone. Retry as is."""
    detail: Dict[str, Any] = {"context": message}
    if errno is not None:
        detail["errno"] = errno
    return UnavailableError(
        message, code="rpc.unavailable", recovery="preparation_retry", detail=detail
    )


def protocol_error(message: str) -> ProtocolError:
    """The daemon sent something that is not a JSON-RPC message this client can read."""
    return ProtocolError(
        message, code="rpc.parse_error", recovery="caller_correction", detail={"context": message}
    )
