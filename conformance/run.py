#!/usr/bin/env python3
"""The custos conformance runner (the process suite and the sandbox suite).

Runs every case of conformance/process/*.json (or of --cases DIR, e.g. conformance/sandbox)
against each backend named on the command line
(`native`, `reference`) through a real `custos daemon` it starts itself (a temporary state dir,
socket and cgroup subtree), and compares what each backend showed with the observations the
case expects. It is written against the JSON-RPC contract only (docs/api.md,
../shared/design/API.md): Python 3 standard library, nothing of the C++ code.

    python3 conformance/run.py native reference
    python3 conformance/run.py --binary build/dev/custos -k cancel native
    python3 conformance/run.py --cases conformance/sandbox reference native

The case format is described in conformance/README.md. Exit status: 0 when no case failed, 1
when one did, 2 for a usage or setup error (no daemon, an invalid case file). The last line of
the output is `N passed, N failed, N skipped` (skipped = unsupported on that backend, each
listed with its reason above).
"""
import argparse
import itertools
import base64
import concurrent.futures
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# The independent encoder (written from docs/canonical-encoding.md and docs/sandbox.md): the
# runner checks the daemon's sandbox digests and control lists against it.
import reference_encoder  # noqa: E402
BACKENDS = ("native", "reference")

# A start refused with one of these codes means the backend cannot run the case on this daemon
# (the case is reported unsupported, with the code and message), unless the case expects it.
UNSUPPORTED_CODES = {"sys.unsupported", "plan.invalid_backend", "sandbox.unsupported",
                     "engine.unavailable"}

# The observations compared for every case (the rest only where a case names them).
TERMINAL_REQUIRED = ("classification", "exit", "trigger", "escalation", "output", "tree")

CASE_KEYS = {"name", "description", "covers", "exclusive", "setup", "request", "backends",
             "rejected", "during", "after", "expect", "timeout_ms"}
BACKEND_KEYS = {"plan", "script", "unsupported", "expect"}
EXPECT_KEYS = {"start", "events", "output", "terminal", "spool"}
ACTION_VERBS = {"wait_event", "wait_output", "sleep_ms", "input", "cancel", "resize", "revoke",
                "release_lease", "kill_daemon", "stop_daemon", "restart_daemon", "get", "wait",
                "start_again", "exec_check", "check", "touch"}
REJECTED_KEYS = {"plan", "authority", "error", "backends", "detail"}
ACTION_KEYS = ACTION_VERBS | {"expect", "error", "backends", "eof", "timeout_ms"}
CHECKS = {"single_record", "quiet_after_terminal", "pids_gone"}

INHERITED_NAME = "CUSTOS_CONF_INHERITED"
INHERITED_VALUE = "inherited from the daemon"


class CaseError(Exception):
    """A case file that does not follow the format (a setup error, not a failed case)."""


class Failure(Exception):
    """A case run whose observations differ from the expectation."""


class Unsupported(Exception):
    """The backend cannot run this case (a field of the case, or the daemon's typed refusal)."""


class RpcError(Exception):
    def __init__(self, error):
        data = error.get("data") or {}
        self.error = error
        self.code = data.get("code") or str(error.get("code"))
        detail = data.get("detail") or {}
        self.detail = detail
        self.context = detail.get("context") or error.get("message", "")
        super().__init__(f"{self.code}: {self.context}")

    def diagnostics(self):
        return self.detail.get("diagnostics") or []


# ------------------------------------------------------------------------------------- RPC


class Connection:
    """One Unix-socket connection speaking newline-framed JSON-RPC 2.0."""

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.notifications = []

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        except OSError:
            pass
        self.sock.close()

    def send(self, message):
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def read(self, deadline):
        """The next message, None at EOF; raises TimeoutError after `deadline`."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the daemon in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no message from the daemon in time") from None
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid

    def call(self, method, params=None, timeout=10.0):
        """The result of `method`; raises RpcError for an error answer."""
        rid = self.request(method, params or {})
        deadline = time.monotonic() + timeout
        while True:
            msg = self.read(deadline)
            if msg is None:
                raise ConnectionError(f"{method}: the daemon closed the connection")
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RpcError(msg["error"])
                return msg["result"]
            self.notifications.append(msg)


# ---------------------------------------------------------------------------------- daemon


def cgroup_v2_base():
    """The daemon's would-be cgroup parent: <v2 mount>/<our own cgroup>, or None."""
    mount = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ")[0] == "cgroup2":
                    mount = left.split(" ")[4]
                    break
        own = None
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


class Daemon:
    """A `custos daemon` child on a private state dir, socket and cgroup subtree."""

    def __init__(self, binary, tmp, args):
        self.binary = binary
        self.tmp = tmp
        self.state = os.path.join(tmp, "state")
        self.socket = os.path.join(self.state, "custos.sock")
        self.log = os.path.join(tmp, "daemon.log")
        self.extra = list(args)
        base = cgroup_v2_base()
        self.cgroup = None
        if base is not None:
            self.cgroup = os.path.join(base, f"custos-test-conf-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.proc = None
        self.starts = 0

    def start(self, args=()):
        cmd = [self.binary, "daemon", "--state-dir", self.state, "--socket", self.socket,
               "--log-file", self.log, "--no-socket-activation"]
        # Never the daemon's default subtree (<own cgroup>/custos), which other daemons on this
        # host may use: a private one, or no cgroup at all.
        cmd += ["--cgroup-subtree", self.cgroup] if self.cgroup else ["--boundary", "marker"]
        cmd += self.extra + list(args)
        env = dict(os.environ)
        env[INHERITED_NAME] = INHERITED_VALUE
        env.pop("CUSTOS_CONF_ABSENT", None)
        with open(os.path.join(self.tmp, "daemon.stderr"), "ab") as err:
            # A session of its own: a Ctrl-C (or `timeout`) aimed at the runner's process group
            # must not stop the daemon under a running case; the runner stops it itself.
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                         env=env, close_fds=True, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"custos daemon exited with {self.proc.returncode} at start; "
                                   f"log: {self.tail()}")
            try:
                c = Connection(self.socket, timeout=2)
                try:
                    c.call("host.info", timeout=2)
                    return
                finally:
                    c.close()
            except (OSError, TimeoutError, ConnectionError, RpcError):
                time.sleep(0.05)
        raise RuntimeError(f"custos daemon did not answer host.info in 30 s; log: {self.tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def remove_cgroup(self):
        """Kills whatever an execution left in the private subtree and removes it, deepest
        cgroups first (the daemon removes it itself at a clean stop when it is empty)."""
        if not self.cgroup or not os.path.isdir(self.cgroup):
            return
        dirs = [root for root, _, _ in os.walk(self.cgroup)]
        for path in sorted(dirs, key=len, reverse=True):
            try:
                with open(os.path.join(path, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                pass
            for _ in range(200):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)

    def tail(self, n=20):
        text = ""
        for name in (self.log, os.path.join(self.tmp, "daemon.stderr")):
            try:
                with open(name, errors="replace") as f:
                    text += "".join(f.readlines()[-n:])
            except OSError:
                pass
        return text.strip() or "(empty)"

    def connect(self, timeout=10.0):
        return Connection(self.socket, timeout=timeout)


# ------------------------------------------------------------------------------- matching


def is_matcher(v):
    return isinstance(v, dict) and len(v) == 1 and next(iter(v)).startswith("$")


def match(expected, observed, path, problems):
    """Appends to `problems` every place where `observed` does not satisfy `expected`.

    Objects are matched partially (members the expectation does not name are not compared),
    lists and scalars exactly; matcher objects ({"$ge": 1}, ...) as described in README.md.
    """
    if is_matcher(expected):
        op, arg = next(iter(expected.items()))
        ok = True
        if op == "$any":
            ok = True
        elif op == "$ge":
            ok = isinstance(observed, (int, float)) and not isinstance(observed, bool) \
                and observed >= arg
        elif op == "$le":
            ok = isinstance(observed, (int, float)) and not isinstance(observed, bool) \
                and observed <= arg
        elif op == "$in":
            ok = observed in arg
        elif op == "$regex":
            ok = isinstance(observed, str) and re.fullmatch(arg, observed, re.S) is not None
        elif op == "$not_null":
            ok = observed is not None
        elif op == "$ne":
            ok = observed != arg
        else:
            problems.append(f"{path}: unknown matcher {op}")
            return
        if not ok:
            problems.append(f"{path}: expected {op} {json.dumps(arg)}, observed "
                            f"{json.dumps(observed)}")
        return
    if isinstance(expected, dict):
        if not isinstance(observed, dict):
            problems.append(f"{path}: expected an object, observed {json.dumps(observed)}")
            return
        for k, v in expected.items():
            if k not in observed:
                if v is None:
                    continue  # null expected: absent counts as null
                problems.append(f"{path}/{k}: missing (expected {json.dumps(v)})")
                continue
            match(v, observed[k], f"{path}/{k}", problems)
        return
    if isinstance(expected, list):
        if not isinstance(observed, list) or len(observed) != len(expected):
            problems.append(f"{path}: expected {json.dumps(expected)}, observed "
                            f"{json.dumps(observed)}")
            return
        for i, (e, o) in enumerate(zip(expected, observed)):
            match(e, o, f"{path}/{i}", problems)
        return
    if expected != observed or type(expected) is not type(observed):
        if isinstance(expected, (int, float)) and isinstance(observed, (int, float)) \
                and not isinstance(expected, bool) and not isinstance(observed, bool) \
                and expected == observed:
            return
        problems.append(f"{path}: expected {json.dumps(expected)}, observed "
                        f"{json.dumps(observed)}")


def match_bytes(expected, data, path, problems):
    """Output bytes: a string (UTF-8 text, exact), {"$b64": ...}, {"$regex": ...} (on the text),
    {"$len": N} or {"$prefix": "..."}."""
    text = data.decode("utf-8", errors="replace")
    if isinstance(expected, str):
        if data != expected.encode():
            problems.append(f"{path}: expected {json.dumps(expected)}, observed "
                            f"{json.dumps(text)}")
        return
    if not is_matcher(expected):
        problems.append(f"{path}: an output expectation is a string or a matcher")
        return
    op, arg = next(iter(expected.items()))
    if op == "$b64":
        ok = data == base64.b64decode(arg)
    elif op == "$regex":
        ok = re.fullmatch(arg, text, re.S) is not None
    elif op == "$len":
        ok = len(data) == arg
    elif op == "$prefix":
        ok = data.startswith(arg.encode())
    else:
        problems.append(f"{path}: unknown output matcher {op}")
        return
    if not ok:
        problems.append(f"{path}: expected {op} {json.dumps(arg)}, observed {json.dumps(text)} "
                        f"({len(data)} bytes)")


def reference_script(script):
    """The script as API.md defines it: a `text` member of a write step (a case-file convenience)
    becomes its `data_b64`."""
    out = copy.deepcopy(script)
    for step in out.get("steps", []):
        if isinstance(step, dict) and "text" in step:
            step["data_b64"] = base64.b64encode(step.pop("text").encode()).decode()
    return out


def event_pattern(item):
    return {"kind": item} if isinstance(item, str) else item


def match_events(expected, observed, problems):
    """The events other than `output`, in order. An item is a kind, a pattern object, or a list
    of those: a group whose members arrive in any order (a race the contract leaves open)."""
    pos = 0
    for i, item in enumerate(expected):
        group = item if isinstance(item, list) else [item]
        got = observed[pos:pos + len(group)]
        pos += len(group)
        if len(got) < len(group):
            break
        patterns = [event_pattern(g) for g in group]
        if not isinstance(item, list):
            match(patterns[0], got[0], f"events/{i}", problems)
            continue
        # Any order: some assignment of the events to the patterns must match (groups are small).
        for perm in itertools.permutations(got):
            probs = []
            for p, e in zip(patterns, perm):
                match(p, e, "", probs)
            if not probs:
                break
        else:
            problems.append(f"events/{i}: expected {json.dumps(patterns)} in any order, observed "
                            f"{json.dumps([short_event(e) for e in got])}")
    want = sum(len(x) if isinstance(x, list) else 1 for x in expected)
    if len(observed) != want:
        problems.append(f"events: expected {want} ({[g if isinstance(g, (str, list)) else g.get('kind') for g in expected]}), "
                        f"observed {len(observed)} ({[e.get('kind') for e in observed]})")


def short_event(e):
    return {k: v for k, v in e.items() if k not in ("plan_digest", "execution_id", "subscription")}


DELETE = {"$delete": True}


def deep_merge(base, patch):
    """`patch` over `base`: objects merge member by member, anything else replaces; a member
    patched with {"$delete": true} is removed."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v == DELETE:
                out.pop(k, None)
                continue
            out[k] = deep_merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(patch)


PLACEHOLDER = re.compile(r"\{\{([a-z_]+)(?::([A-Za-z0-9_.-]+))?\}\}")


def substitute(value, env):
    """Replaces {{name}} / {{name:arg}} placeholders; a string that is only one placeholder
    takes the value's own type (an epoch stays a number)."""
    if isinstance(value, dict):
        return {k: substitute(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, env) for v in value]
    if not isinstance(value, str) or "{{" not in value:
        return value

    def lookup(m):
        key = m.group(1) + (":" + m.group(2) if m.group(2) else "")
        if key not in env:
            raise CaseError(f"unknown placeholder {{{{{key}}}}}")
        return env[key]

    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return lookup(whole)
    return PLACEHOLDER.sub(lambda m: str(lookup(m)), value)


# ---------------------------------------------------------------------------------- cases


def load_cases(directory):
    cases = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                case = json.load(f)
        except (OSError, ValueError) as e:
            raise CaseError(f"{name}: {e}") from None
        validate_case(case, name)
        cases.append(case)
    if not cases:
        raise CaseError(f"no case files in {directory}")
    return cases


def validate_case(case, filename):
    where = filename
    if not isinstance(case, dict):
        raise CaseError(f"{where}: a case is a JSON object")
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise CaseError(f"{where}: unknown members {sorted(unknown)}")
    for key in ("name", "description", "request", "backends", "expect"):
        if key not in case:
            raise CaseError(f"{where}: `{key}` is required")
    if case["name"] + ".json" != filename:
        raise CaseError(f"{where}: `name` must be the file name without .json")
    if "command" not in case["request"].get("plan", {}):
        raise CaseError(f"{where}: request.plan.command is required")
    for b, spec in case["backends"].items():
        if b not in BACKENDS:
            raise CaseError(f"{where}: unknown backend {b}")
        if set(spec) - BACKEND_KEYS:
            raise CaseError(f"{where}: backends.{b}: unknown members {sorted(set(spec) - BACKEND_KEYS)}")
        if "unsupported" not in spec and b == "reference" and "script" not in spec:
            raise CaseError(f"{where}: backends.reference needs `script` or `unsupported`")
    for b in BACKENDS:
        if b not in case["backends"]:
            raise CaseError(f"{where}: backends.{b} missing (map it, or say why it is unsupported)")
    expect = case["expect"]
    if set(expect) - EXPECT_KEYS:
        raise CaseError(f"{where}: expect: unknown members {sorted(set(expect) - EXPECT_KEYS)}")
    for key in ("events", "output", "terminal"):
        if key not in expect:
            raise CaseError(f"{where}: expect.{key} is required")
    for key in TERMINAL_REQUIRED:
        if key not in expect["terminal"]:
            raise CaseError(f"{where}: expect.terminal.{key} is required")
    if "cleanup" not in expect["terminal"]["tree"]:
        raise CaseError(f"{where}: expect.terminal.tree.cleanup is required")
    for group in ("during", "after"):
        for i, a in enumerate(case.get(group, [])):
            verbs = set(a) & ACTION_VERBS
            if len(verbs) != 1 or set(a) - ACTION_KEYS:
                raise CaseError(f"{where}: {group}[{i}]: one verb of {sorted(ACTION_VERBS)} and "
                                f"only {sorted(ACTION_KEYS - ACTION_VERBS)} beside it")
            if "check" in a and a["check"] not in CHECKS:
                raise CaseError(f"{where}: {group}[{i}]: unknown check {a['check']}")
    for i, r in enumerate(case.get("rejected", [])):
        if "error" not in r:
            raise CaseError(f"{where}: rejected[{i}].error is required")
        if set(r) - REJECTED_KEYS:
            raise CaseError(f"{where}: rejected[{i}]: unknown members {sorted(set(r) - REJECTED_KEYS)}")


def needs_exclusive(case):
    """Cases that change the authority epoch or restart the daemon run alone."""
    if case.get("exclusive") or case.get("setup"):
        return True
    return any(set(a) & {"kill_daemon", "stop_daemon", "restart_daemon", "revoke", "release_lease"}
               for a in case.get("during", []) + case.get("after", []))


# ------------------------------------------------------------------------------------ run


class Subscription(threading.Thread):
    """Reads the exec.start answer and then every exec.event on the start's connection."""

    def __init__(self, conn, request_id):
        super().__init__(daemon=True)
        self.conn = conn
        self.request_id = request_id
        self.cond = threading.Condition()
        self.answer = None           # the exec.start response (result or error)
        self.early = []              # exec.event messages that came before the answer
        self.events = []             # exec.event params, in arrival order
        self.others = []             # anything else that arrived
        self.closed = False
        self.error = None

    def run(self):
        try:
            while True:
                msg = self.conn.read(time.monotonic() + 3600)
                with self.cond:
                    if msg is None:
                        self.closed = True
                        self.cond.notify_all()
                        return
                    if msg.get("id") == self.request_id and ("result" in msg or "error" in msg):
                        self.answer = msg
                    elif msg.get("method") == "exec.event":
                        (self.events if self.answer is not None else self.early).append(
                            msg.get("params", {}))
                    else:
                        self.others.append(msg)
                    self.cond.notify_all()
        except Exception as e:  # noqa: BLE001 - reported as the run's failure
            with self.cond:
                self.error = e
                self.closed = True
                self.cond.notify_all()

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failure(f"timed out after {timeout:.1f} s waiting for {what}")
                if self.closed and not predicate():
                    raise Failure(f"the connection closed while waiting for {what}"
                                  + (f" ({self.error})" if self.error else ""))
                self.cond.wait(left)

    def terminal_seen(self):
        return any(e.get("kind") == "terminal" for e in self.events)

    def output(self, stream):
        data = b""
        for e in sorted(self.events, key=lambda e: e.get("seq", 0)):
            if e.get("kind") == "output" and e.get("stream") == stream:
                data += base64.b64decode(e.get("data_b64", ""))
        return data


class Run:
    """One case on one backend."""

    def __init__(self, runner, case, backend):
        self.runner = runner
        self.case = case
        self.backend = backend
        self.bspec = case["backends"][backend]
        self.daemon = runner.daemon
        self.tag = uuid.uuid4().hex[:10]
        self.env = {"workspace": runner.workspace, "principal": f"uid:{os.getuid()}"}
        self.daemon_killed = False
        self.daemon_stopped = False
        self.sub = None
        self.start_result = None
        self.terminal = None
        self.timeout = case.get("timeout_ms", 15000) / 1000.0 * runner.timeout_scale
        self.env["workspace_id"] = self.identity()["workspace_id"]
        self.env["tag"] = self.tag

    # -- request -------------------------------------------------------------------------

    def identity(self):
        short = re.sub(r"[^A-Za-z0-9]", "", self.case["name"])[:40]
        return {"project_id": "conformance", "session_id": f"s-{short}-{self.backend}-{self.tag}",
                "run_id": "r1", "attempt_id": "a1", "turn_id": "t1",
                "action_id": f"act-{self.tag}", "process_id": "proc-1",
                "workspace_id": f"w-{self.tag}", "resource_id": "res1",
                "environment_id": "env1", "generation": 1, "revision": 1}

    def plan(self):
        plan = {"workspace": {"root": "{{workspace}}", "access": "read_only"},
                "env": [], "io": {"mode": "pipes"},
                # A safety net: no case may hang the suite.
                "limits": {"wall_ms": 30000}}
        plan = deep_merge(plan, self.case["request"]["plan"])
        plan = deep_merge(plan, self.bspec.get("plan", {}))
        if self.backend == "reference":
            plan["backend"] = {"kind": "reference", "script": reference_script(self.bspec["script"])}
        else:
            plan.setdefault("backend", {"kind": "native"})
        return plan

    def params(self, identity, plan_patch=None, authority_patch=None, subscribe=True):
        req = self.case["request"]
        plan = self.plan()
        if plan_patch:
            plan = deep_merge(plan, plan_patch)
        authority = req.get("authority")
        if authority_patch is not None:
            authority = deep_merge(authority or {}, authority_patch)
        self.refresh_epoch()
        params = {"identity": deep_merge(identity, req.get("identity", {})),
                  "plan": substitute(plan, self.env)}
        if authority is not None:
            params["authority"] = substitute(authority, self.env)
        if subscribe:
            params["subscribe"] = True
        return params

    def refresh_epoch(self):
        c = self.daemon.connect()
        try:
            epoch = c.call("authority.list", {})["epoch"]
        finally:
            c.close()
        self.env["epoch"] = epoch
        self.env["stale_epoch"] = epoch - 1

    # -- setup ---------------------------------------------------------------------------

    def setup(self):
        c = self.daemon.connect()
        try:
            for step in self.case.get("setup", []):
                if "grant" in step:
                    spec = substitute(copy.deepcopy(step["grant"]), self.env)
                    spec["id"] = f"g-conf-{self.tag}-{step['as']}"
                    c.call("authority.grant", spec)
                    self.env[f"grant:{step['as']}"] = spec["id"]
                elif "lease" in step:
                    ident = self.identity()
                    r = c.call("lease.acquire", {"workspace_id": ident["workspace_id"],
                                                 "holder_session": ident["session_id"]})
                    self.env[f"lease:{step['as']}"] = r["lease_id"]
                else:
                    raise CaseError(f"{self.case['name']}: unknown setup step {step}")
        finally:
            c.close()

    # -- the run -------------------------------------------------------------------------

    def execute(self):
        if "unsupported" in self.bspec:
            raise Unsupported(self.bspec["unsupported"])
        self.setup()
        identity = self.identity()
        for i, rej in enumerate(self.case.get("rejected", [])):
            self.rejected_attempt(i, identity, rej)
        self.start(identity)
        for i, action in enumerate(self.case.get("during", [])):
            self.act(action, f"during[{i}]")
        self.await_terminal()
        self.standard_checks()
        for i, action in enumerate(self.case.get("after", [])):
            self.act(action, f"after[{i}]")
        self.compare()

    def classify_refusal(self, err, expected=None):
        """Raises Unsupported when `err` is the daemon refusing the backend itself."""
        if expected is not None and err.code == expected:
            return
        # A refusal of the backend itself: its own code, or a diagnostic about /plan/backend
        # (also inside a `plan.invalid` that carries the case's expected finding beside it).
        about_backend = [d for d in err.diagnostics()
                         if d.get("pointer", "").startswith("/plan/backend")]
        if err.code in UNSUPPORTED_CODES or about_backend:
            what = "; ".join(f"{d.get('code')} at {d.get('pointer')}" for d in about_backend)
            missing = err.detail.get("missing")
            if missing:
                what = f"{err.code}, missing {', '.join(missing)}"
                raise Unsupported(f"the daemon refused the {self.backend} backend: {what}")
            raise Unsupported(f"the daemon refused the {self.backend} backend: "
                              f"{what or err.code} ({err.context})")

    def rejected_attempt(self, i, identity, rej):
        if rej.get("backends") is not None and self.backend not in rej["backends"]:
            return
        params = self.params(identity, rej.get("plan"), rej.get("authority"), subscribe=False)
        c = self.daemon.connect()
        try:
            try:
                r = c.call("exec.start", params, timeout=self.timeout)
            except RpcError as e:
                self.classify_refusal(e, rej["error"])
                if e.code != rej["error"]:
                    raise Failure(f"rejected[{i}]: expected error {rej['error']}, got {e}")
                if "detail" in rej:
                    env = dict(self.env, **self.sandbox_env(params["plan"]))
                    problems = []
                    match(substitute(rej["detail"], env), e.detail, f"rejected[{i}] detail",
                          problems)
                    if problems:
                        raise Failure("; ".join(problems))
            else:
                raise Failure(f"rejected[{i}]: expected error {rej['error']}, but the start was "
                              f"accepted: {json.dumps(r)}")
            # No effect: nothing of this session exists.
            listed = c.call("exec.list", {"session_id": identity["session_id"]})["executions"]
            if listed:
                raise Failure(f"rejected[{i}]: the refused start left executions: "
                              f"{[e.get('execution_id') for e in listed]}")
        finally:
            c.close()

    def start(self, identity):
        self.identity_used = identity
        params = self.params(identity)
        conn = self.daemon.connect(timeout=self.timeout)
        self.conn = conn
        rid = conn.request("exec.start", params)
        self.sub = Subscription(conn, rid)
        self.sub.start()
        self.sub.wait_for(lambda: self.sub.answer is not None, self.timeout, "the exec.start answer")
        answer = self.sub.answer
        if "error" in answer:
            err = RpcError(answer["error"])
            self.classify_refusal(err)
            raise Failure(f"exec.start refused: {err}")
        if self.sub.early:
            raise Failure(f"{len(self.sub.early)} exec.event(s) arrived before the exec.start "
                          f"answer (kinds {[e.get('kind') for e in self.sub.early]})")
        self.start_result = answer["result"]
        for key in ("execution_id", "plan_digest", "phase", "subscription"):
            if key not in self.start_result:
                raise Failure(f"the exec.start answer has no `{key}`: {json.dumps(answer)}")
        self.execution_id = self.start_result["execution_id"]
        self.env["execution_id"] = self.execution_id
        self.env["plan_digest"] = self.start_result["plan_digest"]
        self.started_plan = params["plan"]
        self.env.update(self.sandbox_env(params["plan"]))

    @staticmethod
    def sandbox_env(plan):
        """{{sandbox_digest}} and {{controls}} of a plan's sandbox, as the independent encoder
        computes them (null and [] for an unsandboxed plan)."""
        sb = plan.get("sandbox")
        if sb is None:
            return {"sandbox_digest": None, "controls": []}
        return {"sandbox_digest": reference_encoder.sandbox_digest(sb),
                "controls": reference_encoder.controls(reference_encoder.policy(sb))}

    def await_terminal(self):
        if self.daemon_killed:
            # The subscription died with the daemon: the terminal result is the restarted
            # daemon's record. A recovered execution may still be running (adopted or kept
            # running), so the record is polled until it is terminal.
            deadline = time.monotonic() + self.timeout
            c = self.daemon.connect()
            try:
                while True:
                    try:
                        rec = c.call("exec.get", {"execution_id": self.execution_id})
                    except RpcError as e:
                        raise Failure(f"exec.get after the restart: {e}") from None
                    if rec.get("phase") == "terminal":
                        self.terminal = rec.get("terminal")
                        return
                    if time.monotonic() > deadline:
                        raise Failure(f"no terminal record {self.timeout:.0f} s after the "
                                      f"restart (phase {rec.get('phase')})")
                    time.sleep(0.05)
            finally:
                c.close()
        self.sub.wait_for(self.sub.terminal_seen, self.timeout, "the terminal event")
        term = [e for e in self.sub.events if e.get("kind") == "terminal"][0]
        self.terminal = term.get("terminal")

    def standard_checks(self):
        events = self.sub.events
        digest = self.start_result["plan_digest"]
        seqs = [e.get("seq") for e in events]
        if seqs != list(range(1, len(events) + 1)):
            raise Failure(f"event seq not contiguous from 1 in arrival order: {seqs}")
        for e in events:
            if e.get("execution_id") != self.execution_id:
                raise Failure(f"event seq {e.get('seq')} names execution {e.get('execution_id')}")
            if e.get("plan_digest") != digest:
                raise Failure(f"event seq {e.get('seq')} has plan_digest {e.get('plan_digest')}, "
                              f"the start answered {digest}")
            if e.get("subscription") != self.start_result["subscription"]:
                raise Failure(f"event seq {e.get('seq')} names subscription "
                              f"{e.get('subscription')}, the start answered "
                              f"{self.start_result['subscription']}")
            if e.get("dropped"):
                raise Failure(f"event seq {e.get('seq')} reports {e['dropped']} dropped events")
        # The sandbox binds the execution: the start answer names the digest the independent
        # encoder computes from the request's own sandbox (null without one).
        want_sb = self.env.get("sandbox_digest")
        if self.start_result.get("sandbox_digest") != want_sb:
            raise Failure(f"the start answered sandbox_digest "
                          f"{self.start_result.get('sandbox_digest')}, the plan's sandbox digests "
                          f"to {want_sb}")
        kinds = [e.get("kind") for e in events]
        if not self.daemon_killed:
            if kinds.count("terminal") != 1 or kinds[-1] != "terminal":
                raise Failure(f"not exactly one terminal event, last: {kinds}")
        if not isinstance(self.terminal, dict):
            raise Failure(f"no terminal result: {json.dumps(self.terminal)}")
        # Accounting invariants, whatever the case expects.
        for stream, acc in (self.terminal.get("output") or {}).items():
            if acc["observed"] != acc["retained"] + acc["dropped"]:
                raise Failure(f"terminal output.{stream}: observed != retained + dropped: {acc}")
            if acc["dropped"] > 0 and acc["complete"]:
                raise Failure(f"terminal output.{stream}: dropped bytes but complete: {acc}")
        c = self.daemon.connect()
        try:
            # The record and exec.wait say exactly what the terminal event said.
            rec = c.call("exec.get", {"execution_id": self.execution_id})
            if rec.get("sandbox_digest") != want_sb:
                raise Failure(f"exec.get: sandbox_digest {rec.get('sandbox_digest')}, expected "
                              f"{want_sb}")
            if rec.get("phase") != "terminal" or rec.get("terminal") != self.terminal:
                raise Failure(f"exec.get disagrees with the terminal event: phase "
                              f"{rec.get('phase')}, terminal {json.dumps(rec.get('terminal'))}")
            waited = c.call("exec.wait", {"execution_id": self.execution_id, "timeout_ms": 1000})
            if waited != self.terminal:
                raise Failure(f"exec.wait disagrees with the terminal event: {json.dumps(waited)}")
            # The spool holds exactly the retained bytes, and it agrees with what the events
            # carried. (Not after a restart: this build keeps no spool across a daemon restart.)
            self.spool = {}
            if not (self.daemon_killed or self.daemon_stopped):
                for stream, acc in (self.terminal.get("output") or {}).items():
                    data = self.read_spool(c, stream, acc["retained"])
                    self.spool[stream] = data
                    if len(data) != acc["retained"]:
                        raise Failure(f"exec.output {stream}: {len(data)} bytes, the terminal "
                                      f"record says {acc['retained']} retained")
                    carried = self.sub.output(stream)
                    n = min(len(data), len(carried))
                    if data[:n] != carried[:n]:
                        raise Failure(f"exec.output {stream} and the output events disagree "
                                      f"within their first {n} bytes")
        finally:
            c.close()

    def read_spool(self, c, stream, size):
        data = b""
        while True:
            r = c.call("exec.output", {"execution_id": self.execution_id, "stream": stream,
                                       "offset": len(data), "max_bytes": 1 << 20})
            chunk = base64.b64decode(r.get("data_b64", ""))
            data += chunk
            if r.get("eof") or not chunk or len(data) > size:
                return data

    # -- actions -------------------------------------------------------------------------

    def act(self, action, where):
        only = action.get("backends")
        if only is not None and self.backend not in only:
            return
        verb = next(v for v in ACTION_VERBS if v in action)
        arg = substitute(action[verb], self.env)
        timeout = action.get("timeout_ms", self.timeout * 1000) / 1000.0
        if verb == "sleep_ms":
            time.sleep(arg / 1000.0)
            return
        if verb == "wait_event":
            pattern = event_pattern(arg)

            def seen():
                for e in self.sub.events:
                    probs = []
                    match(pattern, e, "", probs)
                    if not probs:
                        return True
                return False
            self.sub.wait_for(seen, timeout, f"{where}: an event {json.dumps(pattern)}")
            return
        if verb == "wait_output":
            stream, needle = arg["stream"], arg["contains"].encode()
            self.sub.wait_for(lambda: needle in self.sub.output(stream), timeout,
                              f"{where}: {json.dumps(arg['contains'])} on {stream}")
            return
        if verb == "kill_daemon":
            self.daemon.kill9()
            self.daemon_killed = True
            self.sub.wait_for(lambda: self.sub.closed, 10, f"{where}: the connection to close")
            return
        if verb == "touch":
            # A file the program waits for: a synchronisation point that needs no daemon.
            path = os.path.join(self.runner.workspace, arg)
            with open(path, "w"):
                pass
            return
        if verb == "stop_daemon":
            self.daemon.stop()
            self.daemon_stopped = True
            return
        if verb == "restart_daemon":
            self.daemon.start(arg.get("args", []))
            return
        if verb == "check":
            self.check(arg, action, where)
            return
        method, params = self.rpc_of(verb, arg, action)
        c = self.daemon.connect(timeout=timeout + 5)
        try:
            try:
                result = c.call(method, params, timeout=timeout + 5)
            except RpcError as e:
                if "error" in action:
                    if e.code != action["error"]:
                        raise Failure(f"{where} {method}: expected error {action['error']}, "
                                      f"got {e}") from None
                    return
                raise Failure(f"{where} {method}: {e}") from None
            if "error" in action:
                raise Failure(f"{where} {method}: expected error {action['error']}, got the "
                              f"result {json.dumps(result)}")
            if "expect" in action:
                problems = []
                match(substitute(action["expect"], self.env), result, f"{where} {method}",
                      problems)
                if problems:
                    raise Failure("; ".join(problems))
        finally:
            c.close()

    def rpc_of(self, verb, arg, action):
        eid = {"execution_id": self.execution_id}
        if verb == "input":
            p = dict(eid)
            if "text" in arg:
                p["data_b64"] = base64.b64encode(arg["text"].encode()).decode()
            if "data_b64" in arg:
                p["data_b64"] = arg["data_b64"]
            if arg.get("eof") or action.get("eof"):
                p["eof"] = True
            return "exec.input", p
        if verb == "cancel":
            return "exec.cancel", {**eid, **arg}
        if verb == "resize":
            return "exec.resize", {**eid, **arg}
        if verb == "get":
            return "exec.get", eid
        if verb == "wait":
            return "exec.wait", {**eid, **arg}
        if verb == "revoke":
            return "authority.revoke", {"grant_id": self.env[f"grant:{arg}"]}
        if verb == "release_lease":
            return "lease.release", {"lease_id": self.env[f"lease:{arg}"]}
        if verb == "start_again":
            return "exec.start", self.params(self.identity_used, arg.get("plan"),
                                             arg.get("authority"), subscribe=False)
        if verb == "exec_check":
            return "exec.check", self.params(self.identity_used, arg.get("plan"),
                                             arg.get("authority"), subscribe=False)
        raise CaseError(f"unknown verb {verb}")

    def check(self, name, action, where):
        if name == "single_record":
            c = self.daemon.connect()
            try:
                listed = c.call("exec.list", {"session_id": self.identity_used["session_id"]})
            finally:
                c.close()
            ids = [e.get("execution_id") for e in listed["executions"]]
            if ids != [self.execution_id]:
                raise Failure(f"{where}: exec.list of the session shows {ids}, expected exactly "
                              f"[{self.execution_id}]")
            only = listed["executions"][0]
            if only.get("phase") != "terminal" or only.get("terminal") != self.terminal:
                raise Failure(f"{where}: the listed record is not the one terminal result: "
                              f"{json.dumps(only)}")
        elif name == "quiet_after_terminal":
            ms = action.get("timeout_ms", 300)
            before = len(self.sub.events)
            time.sleep(ms / 1000.0)
            with self.sub.cond:
                later = self.sub.events[before:]
            if later:
                raise Failure(f"{where}: events after the terminal one: "
                              f"{[e.get('kind') for e in later]}")
        elif name == "pids_gone":
            pids = [int(p) for p in re.findall(rb"\d+", self.sub.output("stdout"))]
            if not pids:
                raise Failure(f"{where}: no pids on stdout")
            alive = []
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue  # gone
                if state not in ("Z", "X"):
                    alive.append(pid)
            if alive:
                raise Failure(f"{where}: descendants still alive after the terminal result: "
                              f"{alive}")

    # -- comparison ----------------------------------------------------------------------

    def compare(self):
        expect = deep_merge(self.case["expect"], self.bspec.get("expect", {}))
        expect = substitute(expect, self.env)
        problems = []
        observed = [e for e in self.sub.events if e.get("kind") != "output"]
        match_events(expect["events"], observed, problems)
        if "start" in expect:
            match(expect["start"], self.start_result, "start", problems)
        mode_streams = {"stdout", "stderr", "pty"}
        for stream in sorted(mode_streams):
            data = self.sub.output(stream)
            if stream in expect["output"]:
                match_bytes(expect["output"][stream], data, f"output/{stream}", problems)
            elif data:
                problems.append(f"output/{stream}: expected nothing, observed "
                                f"{json.dumps(data.decode('utf-8', 'replace'))}")
        match(expect["terminal"], self.terminal, "terminal", problems)
        for stream, exp in expect.get("spool", {}).items():
            match_bytes(exp, self.spool.get(stream, b""), f"spool/{stream}", problems)
        if problems:
            raise Failure("; ".join(problems))

    def close(self):
        if self.sub is not None:
            self.conn.close()


class Runner:
    def __init__(self, args):
        self.args = args
        self.timeout_scale = args.timeout_scale
        self.tmp = tempfile.mkdtemp(prefix="custos-conf-")
        os.chmod(self.tmp, 0o755)
        self.workspace = os.path.join(self.tmp, "ws")
        os.makedirs(os.path.join(self.workspace, "sub", "dir"))
        self.daemon = Daemon(args.binary, self.tmp, args.daemon_arg or [])
        self.lock = threading.Lock()
        self.results = []

    def cleanup(self):
        try:
            self.daemon.stop()
        finally:
            self.daemon.kill9()
            self.daemon.remove_cgroup()
            if self.args.keep:
                print(f"kept {self.tmp}", file=sys.stderr)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    def run_one(self, case, backend):
        run = Run(self, case, backend)
        t0 = time.monotonic()
        try:
            run.execute()
            status, detail = "passed", ""
        except Unsupported as e:
            status, detail = "unsupported", str(e)
        except Failure as e:
            status, detail = "failed", str(e)
        except CaseError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else is this run's failure, shown
            status, detail = "failed", f"{type(e).__name__}: {e}"
            if self.args.verbose:
                traceback.print_exc()
        finally:
            run.close()
            if not self.daemon.alive():
                # A case that killed the daemon and failed before restarting it.
                try:
                    self.daemon.start()
                except RuntimeError as e:
                    status, detail = "failed", f"{detail}; the daemon could not restart: {e}"
        ms = int((time.monotonic() - t0) * 1000)
        with self.lock:
            self.results.append((case["name"], backend, status, detail))
            mark = {"passed": "PASS", "failed": "FAIL", "unsupported": "UNSUPPORTED"}[status]
            line = f"{mark:11} {backend:9} {case['name']} ({ms} ms)"
            if detail and (status != "passed"):
                line += f"\n            {detail}"
            if status == "failed" and self.args.verbose:
                line += "\n            events: " + json.dumps(
                    [e for e in (run.sub.events if run.sub else [])])[:4000]
                line += "\n            terminal: " + json.dumps(run.terminal)
            print(line, flush=True)

    def run(self, cases, backends):
        self.daemon.start()
        c = self.daemon.connect()
        try:
            boundary = c.call("host.info").get("default_boundary")
        finally:
            c.close()
        if boundary == "marker" and self.args.jobs > 1:
            # The marker boundary's cleanup check counts any unattributed orphan, another
            # execution's included (docs/supervisor.md): concurrent cases would blur each other.
            print("conformance: marker boundary: cases run one at a time", flush=True)
            self.args.jobs = 1
        pairs = [(c, b) for c in cases for b in backends]
        shared = [p for p in pairs if not needs_exclusive(p[0])]
        alone = [p for p in pairs if needs_exclusive(p[0])]
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.args.jobs)
        try:
            for f in [pool.submit(self.run_one, c, b) for c, b in shared]:
                f.result()
        finally:
            # On an interrupt or a case error, runs not yet begun are dropped, not waited for.
            pool.shutdown(wait=True, cancel_futures=True)
        for c, b in alone:
            self.run_one(c, b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backends", nargs="+", choices=BACKENDS, help="backends to run every case on")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "dev", "custos"),
                    help="the custos binary (default: build/dev/custos)")
    ap.add_argument("--cases", default=os.path.join(HERE, "process"), help="case directory")
    ap.add_argument("-k", dest="filter", help="only cases whose name contains this")
    ap.add_argument("-j", "--jobs", type=int, default=4,
                    help="cases run concurrently (those that restart the daemon or change the "
                         "authority epoch always run alone)")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiply every case's timeout (slow machines)")
    ap.add_argument("--daemon-arg", action="append", metavar="ARG",
                    help="extra argument for `custos daemon` (repeatable; --daemon-arg=--flag)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="print events of failed runs")
    args = ap.parse_args()

    try:
        cases = load_cases(args.cases)
    except CaseError as e:
        print(f"conformance: invalid case: {e}", file=sys.stderr)
        return 2
    if args.filter:
        cases = [c for c in cases if args.filter in c["name"]]
    if not os.access(args.binary, os.X_OK):
        print(f"conformance: no executable at {args.binary} (build it, or pass --binary)",
              file=sys.stderr)
        return 2
    backends = list(dict.fromkeys(args.backends))

    runner = Runner(args)
    interrupted = []

    def on_signal(signum, _frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        runner.run(cases, backends)
    except KeyboardInterrupt:
        print("conformance: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, CaseError, OSError) as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    finally:
        runner.cleanup()

    counts = {"passed": 0, "failed": 0, "unsupported": 0}
    per_backend = {b: dict(counts) for b in backends}
    for _, b, status, _ in runner.results:
        counts[status] += 1
        per_backend[b][status] += 1
    for b in backends:
        c = per_backend[b]
        print(f"{b}: {c['passed']} passed, {c['failed']} failed, {c['unsupported']} unsupported")
    reasons = {}
    for name, b, status, detail in sorted(runner.results):
        if status == "unsupported":
            reasons.setdefault((b, detail), []).append(name)
    for (b, detail), names in sorted(reasons.items()):
        print(f"  unsupported on {b} ({len(names)}): {detail}")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['unsupported']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
