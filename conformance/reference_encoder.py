#!/usr/bin/env python3
"""An independent implementation of docs/canonical-encoding.md, written from that page only.

It encodes each accepted vector's identity and `expect.effective_plan` and checks the result
against the vector's `canonical_hex` and `digest`; for a sandboxed plan it also derives the
checked sandbox plan's controls from the rules of docs/sandbox.md, encodes the checked plan, and
checks `expect.sandbox` (controls, bytes, digest) — the plan's bytes carry that digest.
Run: python3 conformance/reference_encoder.py. Exit status 0 when every vector matches.

The functions checked_sandbox() and sandbox_digest() are also used by conformance/run.py to
check the daemon's sandbox digests independently.
"""
import base64
import hashlib
import json
import pathlib
import struct
import sys

U8, U32, U64, I64, BOOL, BYTES, STRING, RECORD, LIST = range(1, 10)
SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGUSR1": 10, "SIGUSR2": 12, "SIGTERM": 15}
TERMINATING = dict(SIGNALS, SIGILL=4, SIGTRAP=5, SIGABRT=6, SIGBUS=7, SIGFPE=8, SIGKILL=9,
                   SIGSEGV=11, SIGPIPE=13, SIGALRM=14, SIGSTKFLT=16, SIGXCPU=24, SIGXFSZ=25,
                   SIGVTALRM=26, SIGPROF=27, SIGIO=29, SIGPWR=30, SIGSYS=31)
USE = ["cpu_ms", "memory_bytes", "disk_bytes", "descriptors"]
LIMITS = ["wall_ms", "cpu_ms", "memory_bytes", "processes", "open_files", "disk_bytes",
          "output_bytes", "stdin_bytes"]
IDS = ["project_id", "session_id", "run_id", "attempt_id", "turn_id", "action_id", "process_id",
       "workspace_id", "resource_id", "environment_id"]


def scalar(t, v):
    if t == U8 or t == BOOL:
        return struct.pack(">B", int(v))
    if t == U32:
        return struct.pack(">I", v)
    if t == U64:
        return struct.pack(">Q", v)
    if t == STRING:
        return v.encode("utf-8")
    if t == BYTES:
        return bytes(v)
    raise ValueError(t)


def field(tag, t, payload):
    return struct.pack(">HBI", tag, t, len(payload)) + payload


def record(kind, fields):
    """fields: list of (tag, type, payload-bytes) in tag order; returns a record payload."""
    return struct.pack(">H", kind) + b"".join(field(*f) for f in fields)


def lst(elem_type, payloads):
    return struct.pack(">BI", elem_type, len(payloads)) + b"".join(
        struct.pack(">I", len(p)) + p for p in payloads)


def identity(i):
    fs = [(n + 1, STRING, scalar(STRING, i[k])) for n, k in enumerate(IDS)]
    fs += [(11, U64, scalar(U64, i["generation"])), (12, U64, scalar(U64, i["revision"]))]
    return record(0x0001, fs)


def step(st):
    """One reference-script step: a record whose kind says what the step does."""
    if "write" in st:
        return record(0x0020, [(1, U8, scalar(U8, {"stdout": 1, "stderr": 2}[st["write"]])),
                               (2, BYTES, scalar(BYTES, base64.b64decode(st["data_b64"], validate=True)))])
    if "sleep_ms" in st:
        return record(0x0021, [(1, U64, scalar(U64, st["sleep_ms"]))])
    if "spawn" in st:
        return record(0x0022, [(1, U64, scalar(U64, st["spawn"]))])
    if "ignore" in st:
        return record(0x0023, [(1, U32, scalar(U32, SIGNALS[st["ignore"]]))])
    if "use" in st:
        return record(0x0024, [(n + 1, U64, scalar(U64, st["use"][k])) for n, k in enumerate(USE)
                               if k in st["use"]])
    if "read_stdin" in st:
        return record(0x0025, [(1, U64, scalar(U64, st["read_stdin"]))])
    if "exit" in st:
        return record(0x0026, [(1, U8, scalar(U8, st["exit"]))])
    return record(0x0027, [(1, U32, scalar(U32, TERMINATING[st["signal"]]))])


RIGHTS = ["discover", "metadata", "read", "execute", "create", "write", "remove"]
DIMS = ["wall_ms", "cpu_ms", "memory_bytes", "disk_bytes", "output_bytes", "descriptors",
        "processes", "concurrency"]
MODES = {"pipes": 1, "pty": 2}
OUTBOUND = {"none": 1, "tcp_connect": 2, "any": 3}
CHANNELS = {"env": 1, "file": 2, "fd": 3}


def bits(names, order, base=0):
    """A set of names as a bit mask: bit i is order[i] (order[i] has value i + base)."""
    return sum(1 << order.index(n) for n in set(names))


def mount_expressible(rights):
    """A mount gives a read-only or read-write view (each with discover, metadata and read),
    with or without execute, or hides the path: any other set of rights needs Landlock."""
    r = set(rights) - {"execute"}
    return not rights or r == {"discover", "metadata", "read"} or \
        r == {"discover", "metadata", "read", "create", "write", "remove"}


def normalize(path):
    """Lexically: empty and "." components dropped ("/usr//lib/." is "/usr/lib")."""
    parts = [c for c in path.split("/") if c not in ("", ".")]
    return "/" + "/".join(parts)


def policy(sb):
    """The effective policy of a sandbox JSON object (every default filled, lists as sets)."""
    fs = {}
    for e in sb.get("filesystem", []):
        fs[normalize(e["path"])] = sorted(set(e["allow"]), key=RIGHTS.index)
    proc = sb.get("process", {})
    descendants = proc.get("descendants", False)
    net = sb.get("network", {}).get("outbound", "none")
    if isinstance(net, dict):
        outbound, ports = "tcp_connect", sorted(set(net["tcp_connect"]))
    else:
        outbound, ports = net, []
    secrets = set()
    for x in sb.get("secrets", []):
        (channel, target), = x["to"].items()
        secrets.add((x["ref"], CHANNELS[channel], target if channel != "fd" else "",
                     target if channel == "fd" else 0))
    term = sb.get("terminal", {})
    return {
        "filesystem": sorted(fs.items()),
        "descendants": descendants,
        "max_processes": proc.get("max_processes", 1) if descendants else 1,
        "run_as_root": proc.get("run_as_root", False),
        "env": sorted(set(sb.get("environment", {}).get("allow", []))),
        "outbound": outbound, "ports": ports,
        "secrets": sorted(secrets),
        "enforce": sorted(set(sb.get("resources", {}).get("enforce", [])), key=DIMS.index),
        "modes": sorted(set(term.get("modes", ["pipes"])), key=MODES.get),
        "input": term.get("input", False), "resize": term.get("resize", False),
    }


def controls(p):
    """The controls a policy needs (docs/sandbox.md, "Controls")."""
    c = {"filesystem.mount_namespace", "process.no_new_privs", "environment.allow",
         "network.no_inbound", "process.pid_namespace"}
    if any(not mount_expressible(r) for _, r in p["filesystem"]):
        c.add("filesystem.landlock")
    c.add("process.max_processes" if p["descendants"] else "process.no_descendants")
    if not p["run_as_root"]:
        c.add("process.non_root")
    if p["outbound"] == "none":
        c.add("network.none")
    if p["outbound"] == "tcp_connect":
        c.add("network.tcp_connect")
    for _, channel, _, _ in p["secrets"]:
        c.add("secrets." + {1: "env", 2: "file", 3: "fd"}[channel])
    for d in p["enforce"]:
        c.add("resources." + d)
    return sorted(c)


def checked_sandbox(sb):
    """The checked sandbox plan document (kind 0x0200) of a sandbox JSON object."""
    p = policy(sb)
    fs = [record(0x0201, [(1, STRING, scalar(STRING, path)),
                          (2, U8, scalar(U8, bits(r, RIGHTS)))]) for path, r in p["filesystem"]]
    secrets = []
    for ref, channel, name, fd in p["secrets"]:
        kind = {1: 0x0205, 2: 0x0206, 3: 0x0207}[channel]
        last = (2, U32, scalar(U32, fd)) if channel == 3 else (2, STRING, scalar(STRING, name))
        secrets.append(record(kind, [(1, STRING, scalar(STRING, ref)), last]))
    return document(0x0200, [
        (1, LIST, lst(RECORD, fs)),
        (2, RECORD, record(0x0202, [(1, BOOL, scalar(BOOL, p["descendants"])),
                                    (2, U64, scalar(U64, p["max_processes"])),
                                    (3, U8, scalar(U8, 1)),
                                    (4, BOOL, scalar(BOOL, p["run_as_root"]))])),
        (3, RECORD, record(0x0203, [(1, LIST, lst(STRING, [n.encode() for n in p["env"]]))])),
        (4, RECORD, record(0x0204, [(1, U8, scalar(U8, OUTBOUND[p["outbound"]])),
                                    (2, LIST, lst(U32, [scalar(U32, x) for x in p["ports"]]))])),
        (5, LIST, lst(RECORD, secrets)),
        (6, RECORD, record(0x0208, [(1, U8, scalar(U8, bits(p["enforce"], DIMS)))])),
        (7, RECORD, record(0x0209, [(1, U8, scalar(U8, bits(p["modes"], list(MODES)))),
                                    (2, BOOL, scalar(BOOL, p["input"])),
                                    (3, BOOL, scalar(BOOL, p["resize"]))])),
        (8, LIST, lst(STRING, [c.encode() for c in controls(p)])),
    ])


def sandbox_digest(sb):
    return "sha256:" + hashlib.sha256(checked_sandbox(sb)).hexdigest()


def plan(p):
    c = p["command"]
    fs = [(1, RECORD, record(0x0010, [(1, STRING, scalar(STRING, c["executable"])),
                                     (2, LIST, lst(STRING, [a.encode() for a in c["argv"]]))]))]
    w = p["workspace"]
    fs.append((2, RECORD, record(0x0011, [(1, STRING, scalar(STRING, w["root"])),
                                         (2, U8, scalar(U8, {"read_only": 1, "writable": 2}[w["access"]]))])))
    fs.append((3, STRING, scalar(STRING, p["cwd"])))
    env = []
    for e in p["env"]:
        if e.get("inherit"):
            env.append(record(0x0012, [(1, STRING, scalar(STRING, e["name"]))]))
        else:
            env.append(record(0x0013, [(1, STRING, scalar(STRING, e["name"])),
                                       (2, STRING, scalar(STRING, e["value"]))]))
    fs.append((4, LIST, lst(RECORD, env)))
    io = p["io"]
    if io["mode"] == "pty":
        fs.append((5, RECORD, record(0x0015, [(1, U32, scalar(U32, io["rows"])),
                                             (2, U32, scalar(U32, io["cols"])),
                                             (3, BOOL, scalar(BOOL, io["resize"]))])))
    else:
        fs.append((5, RECORD, record(0x0014, [])))
    lim = [(n + 1, U64, scalar(U64, p["limits"][k])) for n, k in enumerate(LIMITS)
           if p["limits"][k] != "unlimited"]
    fs.append((6, RECORD, record(0x0016, lim)))
    o = p["output"]
    fs.append((7, RECORD, record(0x0017, [(1, U64, scalar(U64, o["chunk_bytes"])),
                                         (2, U64, scalar(U64, o["retained_bytes"])),
                                         (3, U64, scalar(U64, o["spool_bytes"])),
                                         (4, U64, scalar(U64, o["max_events"])),
                                         (5, U8, scalar(U8, {"truncate": 1, "cancel": 2}[o["on_limit"]]))])))
    e = p["escalation"]
    fs.append((8, RECORD, record(0x0018, [(1, U32, scalar(U32, SIGNALS[e["signal"]])),
                                         (2, U64, scalar(U64, e["grace_ms"])),
                                         (3, U64, scalar(U64, e["kill_after_ms"]))])))
    if "user" in p:
        u = p["user"]
        fs.append((9, RECORD, record(0x0019, [(1, U32, scalar(U32, u["uid"])),
                                             (2, U32, scalar(U32, u["gid"])),
                                             (3, LIST, lst(U32, [scalar(U32, g) for g in sorted(u["groups"])]))])))
    if "sandbox" in p:
        digest = hashlib.sha256(checked_sandbox(p["sandbox"])).digest()
        fs.append((10, RECORD, record(0x001D, [(1, BYTES, digest)])))
    else:
        fs.append((10, RECORD, record(0x001A, [])))
    b = p["backend"]
    bf = [(1, U8, scalar(U8, {"native": 1, "reference": 2, "docker": 3, "podman": 4}[b["kind"]]))]
    if "container" in b:
        bf.append((2, STRING, scalar(STRING, b["container"])))
    if "socket" in b:
        bf.append((3, STRING, scalar(STRING, b["socket"])))
    if "script" in b:
        steps = [step(st) for st in b["script"]["steps"]]
        bf.append((4, RECORD, record(0x001C, [(1, LIST, lst(RECORD, steps))])))
    if b.get("gate", "required") != "required":
        bf.append((5, U8, scalar(U8, {"optional": 2}[b["gate"]])))
    fs.append((11, RECORD, record(0x001B, bf)))
    return record(0x0002, fs)


def document(kind, fields):
    body = b"".join(field(*f) for f in fields)
    return b"CSTS" + struct.pack(">HHI", 1, kind, len(body)) + body


def main():
    root = pathlib.Path(__file__).resolve().parent / "vectors"
    failures = 0
    checked = 0
    for path in sorted(root.glob("*.json")):
        v = json.loads(path.read_text(encoding="utf-8"))
        exp = v["expect"]
        if "error" in exp:
            continue
        doc = document(0x0003, [(1, RECORD, identity(v["input"]["identity"])),
                                (2, RECORD, plan(exp["effective_plan"]))])
        digest = "sha256:" + hashlib.sha256(doc).hexdigest()
        ok = doc.hex() == exp["canonical_hex"] and digest == exp["digest"]
        sb = exp["effective_plan"].get("sandbox")
        if (sb is None) != ("sandbox" not in exp):
            ok = False
        elif sb is not None:
            sdoc = checked_sandbox(sb)
            want = exp["sandbox"]
            ok = ok and controls(policy(sb)) == want["controls"] and \
                sdoc.hex() == want["canonical_hex"] and \
                "sha256:" + hashlib.sha256(sdoc).hexdigest() == want["digest"]
            # The request's own sandbox (lists in any order, paths as spelled) means the same.
            ok = ok and checked_sandbox(v["input"]["plan"]["sandbox"]) == sdoc
        checked += 1
        if not ok:
            failures += 1
            print(f"MISMATCH {path.name}", file=sys.stderr)
    print(f"{checked} vectors checked, {failures} mismatches")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
