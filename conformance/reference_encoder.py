#!/usr/bin/env python3
"""An independent implementation of docs/canonical-encoding.md, written from that page only.

It encodes each accepted vector's identity and `expect.effective_plan` and checks the result
against the vector's `canonical_hex` and `digest`. Run: python3 conformance/reference_encoder.py
Exit status 0 when every vector matches.
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
        checked += 1
        if not ok:
            failures += 1
            print(f"MISMATCH {path.name}", file=sys.stderr)
    print(f"{checked} vectors checked, {failures} mismatches")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
