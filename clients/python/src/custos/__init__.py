"""Python client of the custos daemon (docs/api.md): `Client`, `AsyncClient`, `CustosError`."""

from ._aio import AsyncClient
from ._client import Client
from ._errors import (
    AuthorityError,
    CustosError,
    ExecutionError,
    PlanError,
    ProtocolError,
    SandboxError,
    UnavailableError,
)
from ._plan import DEFAULT_INHERIT, default_socket_path
from ._run import RECONNECT_BUDGET, ReconnectGapWarning

__all__ = [
    "AsyncClient",
    "AuthorityError",
    "Client",
    "CustosError",
    "DEFAULT_INHERIT",
    "ExecutionError",
    "PlanError",
    "ProtocolError",
    "RECONNECT_BUDGET",
    "ReconnectGapWarning",
    "SandboxError",
    "UnavailableError",
    "default_socket_path",
]

__version__ = "0.1.0"
