#!/usr/bin/env python3
"""The fleet deployment (docs/fleet.md) against the real binary.

    python3 packaging/test_fleet.py --binary PATH

Checks that the Kubernetes DaemonSet, the container image's files and the Nomad job name the
paths and values the daemon actually uses (its own `custos daemon --help` defaults and the
packaged service's packaging/custos.toml), that the Nomad HCL states what the tested JSON jobspec
states, and then runs the deployment's pieces for real: custos-entrypoint starts a daemon with the
ConfigMap's configuration in a private cgroup (only the state dir and socket moved into a temp
dir), the probe command answers 0 while it serves and 75 once it is gone, `custos run -- /bin/true`
goes through it, and the exporter query of docs/fleet.md reads the terminal records from the
registry after a clean stop and after a SIGKILL, and is refused while the daemon runs.

Needs root, a writable cgroup v2, PyYAML (Debian: python3-yaml), sqlite3 and flock (util-linux).
Every process, cgroup and file it creates is removed before it returns.
"""

import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tomllib

try:
    import yaml
except ImportError:
    sys.exit("test_fleet.py needs PyYAML: apt-get install python3-yaml")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "packaging")
DAEMONSET = os.path.join(PKG, "kubernetes", "custos-daemonset.yaml")
CONTAINERFILE = os.path.join(PKG, "container", "Containerfile")
ENTRYPOINT = os.path.join(PKG, "container", "custos-entrypoint")
NOMAD_JSON = os.path.join(PKG, "nomad", "custos.nomad.json")
NOMAD_HCL = os.path.join(PKG, "nomad", "custos.nomad.hcl")
FLEET_DOC = os.path.join(ROOT, "docs", "fleet.md")
EXIT_UNAVAILABLE = 75  # the CLI's exit code when no daemon answers (docs/cli.md)

FAILED = []
CHECKED = [0]


def expect(ok, what):
    CHECKED[0] += 1
    if not ok:
        FAILED.append(what)
        print(f"  FAIL {what}", flush=True)
    return ok


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def run(argv, timeout=60, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


# --- what the daemon and the packaged service use -------------------------------------------

def daemon_defaults(binary):
    """Root's defaults and the engine sockets, as `custos daemon --help` prints them."""
    text = run([binary, "daemon", "--help"]).stdout
    found = {}
    for key, pattern in (("state-dir", r"--state-dir .*or (/\S+) as root"),
                         ("socket", r"--socket .*or (/\S+) as root"),
                         ("docker-socket", r"--docker-socket TEXT=(\S+)"),
                         ("podman-socket", r"--podman-socket TEXT=(\S+)"),
                         ("shutdown-timeout-ms", r"--shutdown-timeout-ms UINT=(\d+)")):
        m = re.search(pattern, text)
        if expect(m is not None, f"`custos daemon --help` shows the {key} default"):
            found[key] = m.group(1)
    return found


def service_paths():
    """The packaged service: its binary and config file (custos.service), its [daemon] keys."""
    unit = read(os.path.join(PKG, "custos.service"))
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
    config = exec_start[exec_start.index("--config") + 1]
    with open(os.path.join(PKG, "custos.toml"), "rb") as f:
        keys = tomllib.load(f)["daemon"]
    return exec_start[0], config, keys


# --- the Kubernetes manifest -----------------------------------------------------------------

def load_manifest():
    docs = {d["kind"]: d for d in yaml.safe_load_all(read(DAEMONSET)) if d}
    config_map = docs["ConfigMap"]
    toml_text = config_map["data"]["custos.toml"]
    return docs, toml_text, tomllib.loads(toml_text)["daemon"]


def check_manifest(docs, cm, defaults, service):
    binary_path, config_path, service_keys = service
    print("kubernetes manifest", flush=True)
    for kind in ("Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"):
        expect(kind in docs, f"the manifest has a {kind}")
    ns = docs["Namespace"]["metadata"]["name"]
    expect(docs["Namespace"]["metadata"]["labels"].get("pod-security.kubernetes.io/enforce")
           == "privileged", "the namespace admits privileged pods")
    for kind in ("ServiceAccount", "ConfigMap", "DaemonSet"):
        expect(docs[kind]["metadata"]["namespace"] == ns, f"the {kind} is in namespace {ns}")

    for key in ("state-dir", "socket"):
        expect(cm.get(key) == service_keys.get(key) == defaults.get(key),
               f"ConfigMap {key} {cm.get(key)!r} is the service's {service_keys.get(key)!r} "
               f"and the binary's root default {defaults.get(key)!r}")
    expect(cm.get("shutdown") == "cancel", "ConfigMap shutdown is cancel")
    expect(cm.get("no-socket-activation") is True, "ConfigMap turns socket activation off")
    expect(cm.get("log-target") == "console", "ConfigMap logs to stderr (the container log)")

    ds = docs["DaemonSet"]["spec"]
    pod = ds["template"]["spec"]
    expect(pod.get("hostPID") is True, "hostPID: true")
    expect(pod.get("serviceAccountName") == docs["ServiceAccount"]["metadata"]["name"],
           "the pod uses the ServiceAccount")
    expect(pod.get("automountServiceAccountToken") is False, "no API token in the pod")
    expect(ds["updateStrategy"]["type"] == "RollingUpdate"
           and ds["updateStrategy"]["rollingUpdate"].get("maxSurge") == 0,
           "rolling update without surge (never two daemons on one state dir)")
    timeout_s = cm.get("shutdown-timeout-ms", int(defaults.get("shutdown-timeout-ms", 0))) / 1000
    grace = pod.get("terminationGracePeriodSeconds", 30)
    expect(grace > 2 * timeout_s,
           f"terminationGracePeriodSeconds {grace} > 2 x shutdown-timeout {timeout_s} s")

    (c,) = pod["containers"]
    expect(c["securityContext"].get("privileged") is True, "the container is privileged")
    expect("requests" in c.get("resources", {}) and "limits" not in c["resources"],
           "resource requests and no limits (executions share the container's cgroup)")
    expect(c.get("args") == ["--config", config_path],
           f"the container runs with --config {config_path} (as custos.service does)")

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}

    def host_mount(path, what, read_only=False):
        m = mounts.get(path)
        if not expect(m is not None, f"{what} mounted at {path}"):
            return
        v = volumes[m["name"]]
        expect(v.get("hostPath", {}).get("path") == path,
               f"{what}: hostPath {path} at the same path in the container")
        expect(bool(m.get("readOnly")) == read_only,
               f"{what} is {'read-only' if read_only else 'read-write'}")

    host_mount("/sys/fs/cgroup", "the host's cgroup v2 hierarchy")
    host_mount(os.path.dirname(cm["socket"]), "the socket directory")
    host_mount(cm["state-dir"], "the state directory")
    host_mount("/srv/custos", "the shared workspaces")
    cfg = mounts.get(os.path.dirname(config_path))
    if expect(cfg is not None, f"the configuration mounted at {os.path.dirname(config_path)}"):
        expect(volumes[cfg["name"]].get("configMap", {}).get("name")
               == docs["ConfigMap"]["metadata"]["name"], "from the ConfigMap")
    raw = read(DAEMONSET)
    for key in ("docker-socket", "podman-socket"):
        path = defaults.get(key)
        expect(re.search(rf"^\s*#\s*mountPath: {re.escape(str(path))}$", raw, re.M)
               and re.search(rf"^\s*#\s*path: {re.escape(str(path))}$", raw, re.M),
               f"the optional {key} mount names the daemon's default {path}")

    probes = [c.get(k, {}).get("exec", {}).get("command")
              for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    expect(all(p == probes[0] for p in probes) and probes[0],
           "startup, readiness and liveness probes run one command")
    probe = probes[0] or []
    expect(probe[:1] == [binary_path], f"the probe runs the packaged binary {binary_path}")
    expect("--socket" in probe and probe[probe.index("--socket") + 1] == cm["socket"],
           "the probe names the configured socket")
    return probe, grace


def check_containerfile(config_path):
    print("container image", flush=True)
    text = read(CONTAINERFILE)
    cmake = read(os.path.join(ROOT, "CMakeLists.txt"))
    version = re.search(r"project\(custos VERSION (\S+)", cmake)
    expect(re.search(r"^FROM debian:bookworm-slim$", text, re.M), "FROM debian:bookworm-slim")
    m = re.search(r"^ARG CUSTOS_DEB=(\S+)$", text, re.M)
    expect(m and re.fullmatch(rf"custos_{re.escape(version.group(1))}_[a-z0-9]+\.deb", m.group(1)),
           "the image installs custos_<project version>_<arch>.deb")
    copy = re.search(r"^COPY custos-entrypoint (\S+)$", text, re.M)
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    expect(copy and entry and json.loads(entry.group(1)) == [copy.group(1)],
           "ENTRYPOINT is the copied custos-entrypoint")
    expect(cmd and json.loads(cmd.group(1)) == ["--config", config_path],
           f"CMD is --config {config_path}")
    expect(os.access(ENTRYPOINT, os.X_OK), "custos-entrypoint is executable")


# --- Nomad -----------------------------------------------------------------------------------

def check_nomad(toml_text, grace):
    print("nomad job", flush=True)
    job = json.loads(read(NOMAD_JSON))["Job"]
    hcl = read(NOMAD_HCL)
    (group,) = job["TaskGroups"]
    (task,) = group["Tasks"]
    expect(job["Type"] == "system", "a system job")
    expect(task["Driver"] == "raw_exec", "the raw_exec driver")
    tmpl = {t["DestPath"]: t for t in task["Templates"]}
    entry, conf = tmpl.get("local/custos-entrypoint"), tmpl.get("local/custos.toml")
    expect(entry and entry["EmbeddedTmpl"] == read(ENTRYPOINT),
           "the JSON embeds packaging/container/custos-entrypoint verbatim")
    expect(conf and conf["EmbeddedTmpl"] == toml_text,
           "the JSON embeds the ConfigMap's custos.toml verbatim")
    expect(entry and entry.get("Perms") == "0755", "the entrypoint template is executable")
    for t in task["Templates"]:
        for bad in ("{{", "${", "%{"):
            expect(bad not in t["EmbeddedTmpl"],
                   f"{t['DestPath']} has no {bad} (the template engine or HCL would expand it)")
    args = task["Config"]["args"]
    expect(task["Config"]["command"] == "/bin/sh"
           and args == ["${NOMAD_TASK_DIR}/custos-entrypoint", "--config",
                        "${NOMAD_TASK_DIR}/custos.toml"],
           "the task runs the rendered entrypoint with the rendered configuration")
    expect(task["KillSignal"] == "SIGTERM", "kill_signal SIGTERM")
    expect(task["KillTimeout"] == grace * 10**9, f"kill_timeout is the pod's grace, {grace} s")

    # The HCL form: the same values, stated the HCL way. Its heredocs are compared byte for byte.
    def hcl_has(line):
        return expect(re.search(r"^\s*" + line + r"\s*$", hcl, re.M),
                      f"the HCL states {line.replace(chr(92), '')!r}")

    hcl_has(r'type\s+= "system"')
    hcl_has(r'driver = "raw_exec"')
    hcl_has(r'command = "/bin/sh"')
    hcl_has(r'kill_signal\s+= "SIGTERM"')
    hcl_has(rf'kill_timeout = "{grace}s"')
    hcl_has(rf'max_parallel = {job["Update"]["MaxParallel"]}')
    hcl_has(rf'stagger\s+= "{job["Update"]["Stagger"] // 10**9}s"')
    hcl_has(rf'cpu\s+= {task["Resources"]["CPU"]}')
    hcl_has(rf'memory = {task["Resources"]["MemoryMB"]}')
    m = re.search(r"^\s*args\s+= (\[.*\])$", hcl, re.M)
    expect(m and json.loads(m.group(1)) == args, "the HCL args are the JSON's")
    blocks = re.findall(r'destination = "([^"]+)"\s+perms\s+= "(\d+)"\s+change_mode = "(\w+)"\s+'
                        r'data\s+= <<EOT\n(.*?)^EOT$', hcl, re.M | re.S)
    expect({b[0]: (b[1], b[2], b[3]) for b in blocks}
           == {k: (t["Perms"], t["ChangeMode"], t["EmbeddedTmpl"]) for k, t in tmpl.items()},
           "the HCL templates are the JSON's, byte for byte")


# --- the deployment's pieces, run ------------------------------------------------------------

def cgroup_v2_base():
    """<v2 mount>/<our own cgroup> when writable (as conformance/run.py finds it), else None."""
    mount = own = None
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
    if mount is None or own is None:
        return None, None
    base = os.path.normpath(mount + "/" + own)
    return (mount, base) if os.access(base, os.W_OK) else (mount, None)


def remove_cgroup(path):
    """Kills what is left below `path` and removes it, deepest cgroups first."""
    if not os.path.isdir(path):
        return
    for d in sorted((r for r, _, _ in os.walk(path)), key=len, reverse=True):
        try:
            with open(os.path.join(d, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
        for _ in range(500):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def exporter_command():
    """The documented exporter query: the one ```sh block of docs/fleet.md that runs sqlite3."""
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", read(FLEET_DOC), re.S) if "sqlite3" in b]
    if not expect(len(blocks) == 1, "docs/fleet.md has exactly one sqlite3 block"):
        return None
    return shlex.split(blocks[0].replace("\\\n", " "))


class LiveDaemon:
    """A daemon started the DaemonSet's way: custos-entrypoint, the ConfigMap's file."""

    def __init__(self, binary, tmp, cgroup, toml_text):
        self.binary, self.tmp, self.cgroup = binary, tmp, cgroup
        self.state = os.path.join(tmp, "state")
        self.socket = os.path.join(self.state, "custos.sock")
        self.config = os.path.join(tmp, "custos.toml")
        with open(self.config, "w") as f:
            f.write(toml_text)
        # The kubelet creates a DirectoryOrCreate hostPath 0755: the daemon must accept it.
        os.mkdir(self.state, 0o755)
        self.proc = None

    def start(self, probe):
        env = dict(os.environ, CUSTOS_BIN=self.binary, CUSTOS_CGROUP=self.cgroup)
        with open(os.path.join(self.tmp, "daemon.stderr"), "ab") as err:
            self.proc = subprocess.Popen(
                ["/bin/sh", ENTRYPOINT, "--config", self.config, "--state-dir", self.state,
                 "--socket", self.socket, "--log-target", "file",
                 "--log-file", os.path.join(self.tmp, "daemon.log")],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}: {self.tail()}")
            if run(probe, timeout=30).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the probe did not answer 0 within 60 s: {self.tail()}")

    def stop(self, sig=signal.SIGTERM, timeout=45):
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            return None

    def tail(self):
        out = ""
        for name in ("daemon.log", "daemon.stderr"):
            try:
                out += read(os.path.join(self.tmp, name))[-2000:]
            except OSError:
                pass
        return out


def check_live(binary, probe, cm, toml_text, grace):
    print("live daemon", flush=True)
    mount, base = cgroup_v2_base()
    if not expect(os.geteuid() == 0 and base is not None,
                  "running as root with a writable cgroup v2 (the live checks need both)"):
        return
    # The entrypoint refuses a root cgroup (the mount's top is one unless we are in a cgroup
    # namespace) and a systemd service's cgroup.
    bad_ones = ["/sys/fs/cgroup/system.slice/nomad.service"]
    if not os.path.exists(os.path.join(mount, "cgroup.type")):
        bad_ones.append(mount)
    for bad in bad_ones:
        r = run(["/bin/sh", ENTRYPOINT], env=dict(os.environ, CUSTOS_BIN="/bin/false",
                                                  CUSTOS_CGROUP=bad))
        expect(r.returncode == 1 and "custos-entrypoint:" in r.stderr,
               f"the entrypoint refuses to split {bad}")

    tmp = tempfile.mkdtemp(prefix="custos-fleet-", dir="/var/tmp")
    cgroup = os.path.join(base, f"custos-test-fleet-{os.getpid()}-{os.urandom(4).hex()}")
    os.mkdir(cgroup)
    daemon = LiveDaemon(binary, tmp, cgroup, toml_text)
    live_probe = [binary] + [daemon.socket if a == cm["socket"] else a for a in probe[1:]]
    exporter = exporter_command()
    if exporter:
        exporter = [a.replace(cm["state-dir"], daemon.state) for a in exporter]
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    cli = [binary, "--socket", daemon.socket]
    try:
        daemon.start(live_probe)
        r = run(live_probe)
        expect(r.returncode == 0 and "executions" in json.loads(r.stdout),
               "the probe answers 0 with exec.list's result while the daemon serves")
        mode = os.stat(daemon.socket).st_mode & 0o777
        expect(mode == int(cm["socket-mode"], 8),
               f"the socket has the ConfigMap's mode {cm['socket-mode']} (got {mode:o})")
        info = json.loads(run(cli + ["doctor", "--json"]).stdout)
        expect(info.get("cgroup_subtree") == os.path.join(cgroup, "custos"),
               f"executions go to <task cgroup>/custos (host.info: {info.get('cgroup_subtree')})")
        own = read(f"/proc/{daemon.proc.pid}/cgroup")
        expect(re.search(rf"^0::.*/{os.path.basename(cgroup)}/daemon$", own, re.M),
               "the daemon itself runs in <task cgroup>/daemon")
        controllers = set(read(os.path.join(cgroup, "cgroup.controllers")).split())
        enabled = set(read(os.path.join(cgroup, "cgroup.subtree_control")).split())
        expect({"cpu", "memory", "pids"} & controllers <= enabled,
               "the entrypoint enabled every available controller of cpu, memory, pids")
        expect(run(cli + ["run", "--", "/bin/true"], cwd=work).returncode == 0,
               "custos run -- /bin/true exits 0 through the daemon")
        first = [e["execution_id"] for e in json.loads(run(cli + ["ps", "--json"]).stdout)
                 ["executions"]]
        expect(len(first) == 1, f"one execution listed (got {first})")

        if exporter:
            r = run(exporter)
            expect(r.returncode == EXIT_UNAVAILABLE and r.stdout == "",
                   f"the exporter's flock refuses while the daemon runs (exit {r.returncode})")
            bare = exporter[exporter.index("sqlite3"):]
            r = run(bare)
            expect(r.returncode != 0 and "locked" in r.stderr,
                   "without the flock, sqlite3 finds the registry locked while the daemon runs")

        expect(daemon.stop(timeout=grace) == 0, "SIGTERM: the daemon exits 0 within the grace")
        expect(not os.path.isdir(os.path.join(cgroup, "custos")),
               "a clean stop removes the executions' subtree it created")
        r = run(live_probe)
        expect(r.returncode == EXIT_UNAVAILABLE,
               f"the probe exits {EXIT_UNAVAILABLE} once no daemon answers (got {r.returncode})")
        # `custos doctor` is no probe: without a daemon it probes the host itself and exits 0.
        # It runs in a cgroup of ours so that its scratch cgroup stays inside.
        os.mkdir(os.path.join(cgroup, "doctor"))
        r = run(["/bin/sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh",
                 os.path.join(cgroup, "doctor")] + cli + ["doctor", "--json"])
        expect(r.returncode == 0 and "local probe" in json.loads(r.stdout).get("source", ""),
               "custos doctor exits 0 with no daemon (so it cannot be the probe)")

        if exporter:
            rows = check_export(exporter, first, "after a clean stop")
            # A crash: the record committed in the WAL is what a reader must still find.
            daemon.start(live_probe)
            expect(run(cli + ["run", "--", "/bin/true"], cwd=work).returncode == 0,
                   "a second run after the restart exits 0")
            daemon.stop(signal.SIGKILL)
            rows = check_export(exporter, None, "after a SIGKILL")
            expect(len(rows) == 2 and rows[0]["execution_id"] == first[0],
                   "both terminal records survive the daemon's SIGKILL")
            # While an exporter holds the registry's lock, a starting daemon gives up at once.
            with open(os.path.join(daemon.state, "registry.lock")) as lock:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                try:
                    daemon.start(live_probe)
                    expect(False, "a daemon starts while an exporter holds the registry's lock")
                except RuntimeError as e:
                    expect(daemon.proc.returncode == 1 and "registry.locked" in str(e),
                           "a daemon started during the export exits 1 with registry.locked")
            # The reader leaves registry.db-shm beside the file; the next daemon must not mind.
            daemon.start(live_probe)
            listed = json.loads(run(cli + ["ps", "--json"]).stdout)["executions"]
            expect(sorted(e["execution_id"] for e in listed)
                   == sorted(r["execution_id"] for r in rows),
                   "a daemon started after the exporter read lists both records")
            expect(daemon.stop(timeout=grace) == 0, "and stops cleanly")
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
        expect(False, f"live daemon: {e}")
    finally:
        daemon.stop(signal.SIGKILL)
        remove_cgroup(cgroup)
        subprocess.run(["rm", "-rf", "--one-file-system", tmp], check=False)


def check_export(exporter, ids, when):
    r = run(exporter)
    if not expect(r.returncode == 0, f"the exporter query runs {when}: {r.stderr.strip()}"):
        return []
    rows = json.loads(r.stdout or "[]")
    if ids is not None:
        expect([row["execution_id"] for row in rows] == ids,
               f"{when}: the exporter reads the execution that ran ({ids})")
    for row in rows:
        expect(row["classification"] == "exited" and row["recovery"] == "observed"
               and row["actor"] == "uid:0",
               f"{when}: {row['execution_id']} exited, observed, started by uid:0")
        expect("sha256:" + hashlib.sha256(bytes.fromhex(row["terminal_hex"])).hexdigest()
               == row["terminal_digest"],
               f"{when}: the terminal record's bytes hash to its digest")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True, help="the custos binary to test against")
    binary = os.path.abspath(ap.parse_args().binary)
    # A sanitizer build reports leaks at exit with a non-zero status; the CLI's exit codes count.
    os.environ.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    defaults = daemon_defaults(binary)
    service = service_paths()
    docs, toml_text, cm = load_manifest()
    probe, grace = check_manifest(docs, cm, defaults, service)
    check_containerfile(service[1])
    check_nomad(toml_text, grace)
    check_live(binary, probe, cm, toml_text, grace)
    if FAILED:
        print(f"test_fleet: {len(FAILED)} of {CHECKED[0]} checks failed")
        return 1
    print(f"test_fleet: all {CHECKED[0]} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
