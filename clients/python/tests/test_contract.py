"""The client against the machine contract, docs/openrpc.json: every served method is a method
of both clients, with exactly the contract's params (required ones without a default, optional
ones keyword-only defaulting to None) sent under the contract's names, and the clients have no
method the contract does not list beyond their own helpers."""

from __future__ import annotations

import inspect
import json
import keyword
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import custos
from custos import AsyncClient, Client

OPENRPC = Path(
    os.environ.get("CUSTOS_OPENRPC", Path(__file__).resolve().parents[3] / "docs" / "openrpc.json")
)
#: Public members of the clients that are not methods of the contract.
HELPERS = {"call", "run", "next_event", "close", "socket_path"}


def contract() -> List[Dict[str, Any]]:
    return json.loads(OPENRPC.read_text())["methods"]


def py_name(wire: str) -> str:
    return wire + "_" if keyword.iskeyword(wire) else wire


def public_methods(cls: type) -> set:
    return {n for n in dir(cls) if not n.startswith("_")}


class Recorder(Client):
    """A Client whose requests are recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__("/nonexistent")
        self.sent: List[Tuple[str, Dict[str, Any]]] = []

    def _request(self, method: str, params: Dict[str, Any]) -> Any:
        self.sent.append((method, params))
        return {}


def test_the_contract_is_read() -> None:
    names = [m["name"] for m in contract()]
    assert "exec.start" in names and "host.info" in names and len(names) >= 20


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_every_contract_method_is_a_client_method_with_its_params(cls: type) -> None:
    for method in contract():
        attr = method["name"].replace(".", "_")
        assert hasattr(cls, attr), f"{cls.__name__} lacks {attr} ({method['name']})"
        sig = inspect.signature(getattr(cls, attr))
        params = [p for p in sig.parameters.values() if p.name != "self"]
        wanted = {py_name(p["name"]): p.get("required", False) for p in method["params"]}
        got = {p.name: p for p in params}
        assert set(got) == set(wanted), f"{attr}: params {sorted(got)} != contract {sorted(wanted)}"
        for name, required in wanted.items():
            p = got[name]
            if required:
                assert p.default is inspect.Parameter.empty, f"{attr}({name}) must be required"
                assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            else:
                assert p.default is None, f"{attr}({name}) must default to None"
                assert p.kind is inspect.Parameter.KEYWORD_ONLY
            assert p.annotation is not inspect.Parameter.empty, f"{attr}({name}) is untyped"


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_the_clients_have_nothing_the_contract_lacks(cls: type) -> None:
    served = {m["name"].replace(".", "_") for m in contract()}
    extra = public_methods(cls) - served - HELPERS
    assert not extra, f"{cls.__name__} has methods the contract does not: {sorted(extra)}"


def test_each_method_sends_its_wire_name_and_param_names() -> None:
    rec = Recorder()
    for method in contract():
        fn = getattr(rec, method["name"].replace(".", "_"))
        args = {py_name(p["name"]): f"v-{p['name']}" for p in method["params"]}
        fn(**args)
        sent_method, sent = rec.sent[-1]
        assert sent_method == method["name"]
        assert set(sent) == {p["name"] for p in method["params"]}, sent_method
        for p in method["params"]:
            value = sent[p["name"]]
            # Sequences are sent as lists; every other value as given.
            assert value == f"v-{p['name']}" or value == list(f"v-{p['name']}")
        # Optional params left at None are not sent: the daemon applies its default.
        required = {py_name(p["name"]): args[py_name(p["name"])]
                    for p in method["params"] if p.get("required")}
        fn(**required)
        assert set(rec.sent[-1][1]) == {p["name"] for p in method["params"] if p.get("required")}


def test_the_async_client_mirrors_the_sync_one() -> None:
    for name in public_methods(Client) - {"socket_path"}:
        assert hasattr(AsyncClient, name), name
        sync = inspect.signature(getattr(Client, name))
        aio = inspect.signature(getattr(AsyncClient, name))
        assert list(sync.parameters) == list(aio.parameters), name


def test_the_package_is_typed() -> None:
    assert (Path(custos.__file__).parent / "py.typed").is_file()
    for cls in (Client, AsyncClient):
        for name in public_methods(cls) - {"socket_path"}:
            sig = inspect.signature(getattr(cls, name))
            assert sig.return_annotation is not inspect.Signature.empty, name
