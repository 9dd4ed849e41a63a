// A real `custos daemon` for the tests, on a private state dir, socket and cgroup subtree (as
// conformance/run.py's Daemon): started in its own session, stopped with SIGTERM by pid, its
// subtree and temp dirs removed afterwards. The binary comes from $CUSTOS_BINARY.
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { randomBytes } from "node:crypto";

import { Client } from "../src";

export interface TestDaemon {
  socket: string;
  /** The daemon's pid (the same across a handover: the process re-executes itself). */
  pid: number;
  /** A private directory to use as a workspace (not holding the daemon's state). */
  workspace: string;
  log: () => string;
  stop: () => Promise<void>;
}

export function binary(): string {
  const b = process.env.CUSTOS_BINARY;
  if (b === undefined || b === "") throw new Error("set CUSTOS_BINARY to the custos binary");
  return b;
}

// <cgroup2 mount>/<our own cgroup> when writable: the daemon's would-be parent.
function cgroupBase(): string | undefined {
  try {
    let mount: string | undefined;
    for (const line of fs.readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
      const [left, right] = line.split(" - ");
      if (right?.split(" ")[0] === "cgroup2") {
        mount = left?.split(" ")[4];
        break;
      }
    }
    const own = fs
      .readFileSync("/proc/self/cgroup", "utf8")
      .split("\n")
      .find((l) => l.startsWith("0::"))
      ?.slice(3)
      .trim();
    if (mount === undefined || own === undefined) return undefined;
    const base = path.normalize(`${mount}/${own}`);
    fs.accessSync(base, fs.constants.W_OK);
    return base;
  } catch {
    return undefined;
  }
}

// Kills what an execution left in the private subtree and removes it, deepest first.
function removeCgroup(dir: string): void {
  if (!fs.existsSync(dir)) return;
  const dirs: string[] = [];
  const walk = (d: string) => {
    dirs.push(d);
    for (const e of fs.readdirSync(d, { withFileTypes: true }))
      if (e.isDirectory()) walk(path.join(d, e.name));
  };
  walk(dir);
  dirs.sort((a, b) => b.length - a.length);
  for (const d of dirs) {
    try {
      fs.writeFileSync(path.join(d, "cgroup.kill"), "1");
    } catch {
      // no cgroup.kill on old kernels; the daemon emptied it already
    }
    for (let i = 0; i < 200; i++) {
      try {
        fs.rmdirSync(d);
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") break;
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
      }
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function exited(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), ms);
    child.once("exit", () => {
      clearTimeout(t);
      resolve(true);
    });
  });
}

export async function startDaemon(): Promise<TestDaemon> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "custos-ts-"));
  const workspace = fs.mkdtempSync(path.join(os.tmpdir(), "custos-ts-ws-"));
  const state = path.join(tmp, "state");
  const socket = path.join(state, "custos.sock");
  const logFile = path.join(tmp, "daemon.log");
  const base = cgroupBase();
  const cgroup =
    base === undefined
      ? undefined
      : path.join(base, `custos-test-ts-${process.pid}-${randomBytes(4).toString("hex")}`);
  const args = [
    "daemon",
    "--state-dir",
    state,
    "--socket",
    socket,
    "--log-file",
    logFile,
    "--no-socket-activation",
  ];
  args.push(...(cgroup !== undefined ? ["--cgroup-subtree", cgroup] : ["--boundary", "marker"]));
  const errFd = fs.openSync(path.join(tmp, "daemon.stderr"), "a");
  const child = spawn(binary(), args, {
    detached: true, // a session of its own: a Ctrl-C at the test runner does not reach it
    stdio: ["ignore", errFd, errFd],
    env: { ...process.env, ASAN_OPTIONS: process.env.ASAN_OPTIONS ?? "detect_leaks=0" },
  });
  fs.closeSync(errFd);
  const log = () => {
    let text = "";
    for (const f of [logFile, path.join(tmp, "daemon.stderr")]) {
      try {
        text += fs.readFileSync(f, "utf8").split("\n").slice(-20).join("\n");
      } catch {
        // not written yet
      }
    }
    return text;
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      if (!(await exited(child, 20000))) {
        child.kill("SIGKILL");
        await exited(child, 30000);
      }
    }
    if (cgroup !== undefined) removeCgroup(cgroup);
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.rmSync(workspace, { recursive: true, force: true });
  };
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      const why = log();
      await stop();
      throw new Error(
        `custos daemon exited at start (${child.exitCode ?? child.signalCode}): ${why}`,
      );
    }
    const c = new Client({ socketPath: socket });
    try {
      await c.hostInfo();
      return { socket, pid: child.pid as number, workspace, log, stop };
    } catch {
      await sleep(50);
    } finally {
      c.close();
    }
  }
  const why = log();
  await stop();
  throw new Error(`custos daemon did not answer host.info in 60 s: ${why}`);
}
