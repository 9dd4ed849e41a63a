// What `custos run` fills in when the caller does not say (docs/cli.md, src/cli/cmd_run.cpp),
// so that `client.run(argv)` and `custos run -- argv` send the same request.
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";

import { callerError, isObject } from "./errors";
import type { Authority, EnvEntry, ExecStartParams, Identity, Plan } from "./types";

/** $CUSTOS_SOCKET if set, else ./.custos/custos.sock if it exists, else /run/custos/custos.sock */
export function defaultSocketPath(): string {
  const env = process.env.CUSTOS_SOCKET;
  if (env !== undefined && env !== "") return env;
  try {
    if (fs.statSync(".custos/custos.sock").isSocket()) {
      return path.join(process.cwd(), ".custos", "custos.sock");
    }
  } catch {
    // absent: the system socket
  }
  return "/run/custos/custos.sock";
}

/** Names inherited by default so ordinary programs find their tools and locale. */
export const DEFAULT_INHERIT = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM"] as const;

export interface RunPlanOptions {
  /** Workspace root; default the current directory. */
  workspace?: string;
  /** Working directory, inside the workspace; default the current directory. */
  cwd?: string;
  /** `NAME` inherits the daemon's value of NAME, `NAME=VALUE` sets a literal (as `--env`). */
  env?: string[];
  /** Do not inherit PATH HOME USER LOGNAME LANG TERM by default. */
  cleanEnv?: boolean;
  /** Declare the workspace read_only (default writable). */
  readOnly?: boolean;
  /** Wall-clock limit in seconds (the plan's limits.wall_ms; classification timed_out). */
  timeout?: number;
  /** A pseudo-terminal of 24x80 instead of pipes: one output stream, `pty`. */
  pty?: boolean;
  /** Identity members replacing the defaults (session cli-<uid>, ids "cli", generation 0). */
  identity?: Partial<Identity>;
  /** The authority claimed: a grant of the caller's, and the workspace's lease. */
  authority?: Authority;
  /** Plan members replacing the built ones (limits, output, escalation, sandbox, user, ...). */
  plan?: Partial<Plan>;
}

function isExecutableFile(p: string): boolean {
  try {
    if (!fs.statSync(p).isFile()) return false;
    fs.accessSync(p, fs.constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * A bare name is looked up in PATH like execvp would; a name with '/' is taken relative to the
 * current directory. Fails with plan.invalid_executable.
 */
export function resolveExecutable(name: string): string {
  if (name === "")
    throw callerError("plan.invalid_executable", "empty command", "/plan/command/executable");
  if (name.includes("/")) {
    const p = path.resolve(name);
    if (!isExecutableFile(p)) {
      throw callerError(
        "plan.invalid_executable",
        `${p} is not an executable file`,
        "/plan/command/executable",
      );
    }
    return p;
  }
  const search = process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin";
  for (const dir of search.split(":")) {
    const candidate = path.resolve(dir === "" ? "." : dir, name);
    if (isExecutableFile(candidate)) return candidate;
  }
  throw callerError(
    "plan.invalid_executable",
    `${name}: not found in PATH`,
    "/plan/command/executable",
  );
}

function randomHex(n: number): string {
  return randomBytes(Math.ceil(n / 2))
    .toString("hex")
    .slice(0, n);
}

/** The identity `custos run` sends: a fresh run and action id for every start. */
export function defaultIdentity(overrides: Partial<Identity> = {}): Identity {
  const uid = typeof process.getuid === "function" ? process.getuid() : 0;
  return {
    project_id: "cli",
    session_id: `cli-${uid}`,
    run_id: `run-${randomHex(16)}`,
    attempt_id: "a1",
    turn_id: "t1",
    action_id: `act-${randomHex(16)}`,
    process_id: "proc-1",
    workspace_id: "cli",
    resource_id: "cli",
    environment_id: "cli",
    generation: 0,
    revision: 0,
    ...overrides,
  };
}

/**
 * The plan's environment: the default names inherited (unless cleanEnv), `NAME` entries
 * inherited, `NAME=VALUE` literals. A literal wins over a default inheritance of its name; under
 * a sandbox only the default names its environment.allow lists are inherited by default.
 */
export function planEnv(
  env: readonly string[] = [],
  cleanEnv = false,
  sandbox?: Record<string, unknown>,
): EnvEntry[] {
  const out: EnvEntry[] = [];
  const seen = new Set<string>();
  const literals: Array<[string, string]> = [];
  for (const e of env) {
    const eq = e.indexOf("=");
    if (eq >= 0) literals.push([e.slice(0, eq), e.slice(eq + 1)]);
  }
  const inherit = (name: string) => {
    if (seen.has(name)) return;
    seen.add(name);
    out.push({ name, inherit: true });
  };
  const allowed = sandbox === undefined ? undefined : sandboxEnvAllow(sandbox);
  if (!cleanEnv) {
    for (const name of DEFAULT_INHERIT) {
      if (process.env[name] === undefined) continue;
      if (literals.some(([k]) => k === name)) continue;
      if (allowed !== undefined && !allowed.includes(name)) continue;
      inherit(name);
    }
  }
  for (const e of env) if (!e.includes("=")) inherit(e);
  for (const [name, value] of literals) {
    if (seen.has(name)) continue;
    seen.add(name);
    out.push({ name, value });
  }
  return out;
}

function sandboxEnvAllow(sandbox: Record<string, unknown>): string[] {
  const env = sandbox.environment;
  if (!isObject(env) || !Array.isArray(env.allow)) return [];
  return env.allow.filter((n): n is string => typeof n === "string");
}

/** exec.start params for `argv` as `custos run` builds them (without `subscribe`). */
export function buildRunParams(argv: readonly string[], o: RunPlanOptions = {}): ExecStartParams {
  if (argv.length === 0)
    throw callerError("plan.empty_argv", "run needs a command", "/plan/command/argv");
  const executable = resolveExecutable(argv[0] as string);
  const here = process.cwd();
  const workspace = o.workspace === undefined ? here : path.resolve(o.workspace);
  const cwd = o.cwd === undefined ? here : path.resolve(o.cwd);
  const rel = path.relative(workspace, cwd) || ".";
  const sandbox = o.plan?.sandbox;
  const plan: Plan = {
    command: { executable, argv: [...argv] },
    workspace: { root: workspace, access: o.readOnly ? "read_only" : "writable" },
    cwd: rel,
    env: planEnv(o.env, o.cleanEnv, sandbox),
    io: o.pty ? { mode: "pty", rows: 24, cols: 80, resize: true } : { mode: "pipes" },
    ...o.plan,
  };
  if (o.timeout !== undefined && o.timeout > 0) {
    plan.limits = { ...plan.limits, wall_ms: Math.max(1, Math.floor(o.timeout * 1000)) };
  }
  return {
    identity: defaultIdentity(o.identity),
    plan,
    authority: { epoch: 0, grant_id: null, lease_id: null, ...o.authority },
  };
}
