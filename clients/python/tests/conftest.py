"""A real `custos daemon` for the suite: a private state dir, socket and cgroup subtree.

The binary comes from `--binary PATH` or `$CUSTOS_BINARY`. The daemon runs in a session of its
own (a Ctrl-C aimed at pytest does not stop it under a running test) and is stopped with SIGTERM
by pid; its private cgroup subtree is emptied and removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest

from custos import Client, CustosError

#: Set in the daemon's environment, so a test can see an inherited value come from the daemon.
INHERITED_NAME = "CUSTOS_PYCLIENT_INHERITED"
INHERITED_VALUE = "from-the-daemon"
#: The daemon's idle timeout here: short, so reconnecting after it is tested in seconds.
IDLE_TIMEOUT_MS = 1500


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--binary", default=None, help="the custos binary (else $CUSTOS_BINARY)")


def cgroup_v2_base() -> Optional[str]:
    """<cgroup v2 mount>/<our own cgroup> when writable, else None (then --boundary marker)."""
    mount = own = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ")[0] == "cgroup2":
                    mount = left.split(" ")[4]
                    break
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    own = line[3:].strip()
    except OSError:
        return None
    if mount is None or own is None:
        return None
    base = os.path.normpath(mount + "/" + own)
    return base if os.access(base, os.W_OK) else None


def remove_cgroup(path: str) -> None:
    """Kills what executions left in the private subtree and removes it, deepest first."""
    if not os.path.isdir(path):
        return
    for folder in sorted((root for root, _, _ in os.walk(path)), key=len, reverse=True):
        try:
            with open(os.path.join(folder, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
        for _ in range(200):
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


class Daemon:
    def __init__(self, binary: str, tmp: str) -> None:
        self.binary = binary
        self.tmp = tmp
        self.state = os.path.join(tmp, "state")
        self.socket = os.path.join(self.state, "custos.sock")
        self.log = os.path.join(tmp, "daemon.log")
        base = cgroup_v2_base()
        self.cgroup = (
            os.path.join(base, f"custos-test-pyclient-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            if base
            else None
        )
        self.proc: Optional["subprocess.Popen[bytes]"] = None

    def start(self) -> None:
        cmd = [self.binary, "daemon", "--state-dir", self.state, "--socket", self.socket,
               "--log-file", self.log, "--no-socket-activation",
               "--idle-timeout-ms", str(IDLE_TIMEOUT_MS)]
        cmd += ["--cgroup-subtree", self.cgroup] if self.cgroup else ["--boundary", "marker"]
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        env[INHERITED_NAME] = INHERITED_VALUE
        with open(os.path.join(self.tmp, "daemon.stderr"), "ab") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                         env=env, close_fds=True, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"custos daemon exited with {self.proc.returncode}: {self.tail()}"
                )
            try:
                with Client(self.socket) as c:
                    c.host_info()
                return
            except CustosError:
                time.sleep(0.05)
        raise RuntimeError(f"custos daemon did not answer in 60 s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.cgroup:
            remove_cgroup(self.cgroup)

    def tail(self, lines: int = 20) -> str:
        text = ""
        for name in (self.log, os.path.join(self.tmp, "daemon.stderr")):
            try:
                with open(name, errors="replace") as f:
                    text += "".join(f.readlines()[-lines:])
            except OSError:
                pass
        return text.strip() or "(empty)"


@pytest.fixture(scope="session")
def binary(request: pytest.FixtureRequest) -> str:
    path = request.config.getoption("--binary") or os.environ.get("CUSTOS_BINARY")
    if not path:
        raise pytest.UsageError("give the custos binary: --binary PATH or $CUSTOS_BINARY")
    if not os.access(path, os.X_OK):
        raise pytest.UsageError(f"not an executable: {path}")
    return os.path.abspath(path)


def running_daemon(binary: str, prefix: str) -> Iterator[Daemon]:
    """A started daemon in a fresh temporary directory; stopped and removed afterwards."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    d = Daemon(binary, tmp)
    try:
        d.start()
        yield d
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(binary: str) -> Iterator[Daemon]:
    yield from running_daemon(binary, "custos-pyclient-")


@pytest.fixture
def socket_path(daemon: Daemon) -> str:
    return daemon.socket


@pytest.fixture
def client(socket_path: str) -> Iterator[Client]:
    with Client(socket_path) as c:
        yield c


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace of the test's own (the daemon's state dir is elsewhere), and the current
    directory: `run()`, like `custos run`, takes both the workspace and the cwd from it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return ws
