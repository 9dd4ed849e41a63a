// An agent's tool-call runner: it grants itself exactly the authority one tool call needs,
// runs the call under that grant with its output streamed, and cancels it at a deadline.
//
//   node dist/examples/agent-runner.js [--socket PATH] [--workspace DIR] [--deadline-ms N] \
//       -- EXE ARG...
//
// As an admin (docs/authority.md) it grants the caller's own uid a runner grant limited to this
// one executable, one workspace, PATH as the only inherited name and a budget of one execution;
// takes the workspace's mutation lease (a writable workspace under a grant needs it); runs the
// command with both named in its authority; and revokes the grant and releases the lease at
// the end. Prints the output live, then one JSON line with the outcome, and exits like
// `custos run` (124 timed out, 125 cancelled, the child's code otherwise).
import { randomBytes } from "node:crypto";
import * as path from "node:path";

import { Client, CustosError, exitCode, resolveExecutable } from "../src";

interface Args {
  socket?: string;
  workspace: string;
  deadlineMs: number;
  argv: string[];
}

function parseArgs(args: string[]): Args {
  const out: Args = { workspace: process.cwd(), deadlineMs: 30000, argv: [] };
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    const value = () => {
      const v = args[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    if (a === "--") {
      out.argv = args.slice(i + 1);
      break;
    } else if (a === "--socket") out.socket = value();
    else if (a === "--workspace") out.workspace = path.resolve(value());
    else if (a === "--deadline-ms") out.deadlineMs = Number(value());
    else throw new Error(`unknown argument ${a}`);
  }
  if (out.argv.length === 0 || !(out.deadlineMs > 0)) {
    throw new Error(
      "usage: agent-runner [--socket PATH] [--workspace DIR] [--deadline-ms N] -- EXE ARG...",
    );
  }
  return out;
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2));
  const client = new Client(args.socket === undefined ? {} : { socketPath: args.socket });
  const uid = process.getuid?.() ?? 0;
  const tag = randomBytes(6).toString("hex");
  const workspaceId = `agent-${tag}`;
  const session = `agent-session-${tag}`;
  const executable = resolveExecutable(args.argv[0] as string);

  // The authority for this one tool call, and nothing more.
  const { grant } = await client.authorityGrant({
    principal: `uid:${uid}`,
    role: "runner",
    operations: ["exec.native"],
    executables: [{ path: executable, prefix: false }],
    workspaces: [{ workspace_id: workspaceId, root: args.workspace, max_access: "writable" }],
    environment_ids: ["cli"],
    resource_ids: ["cli"],
    inherit_env: ["PATH"],
    literal_env: false,
    budget: { executions: 1 },
  });
  let leaseId: string | undefined;
  try {
    leaseId = (await client.leaseAcquire({ workspace_id: workspaceId, holder_session: session }))
      .lease_id;
    // The deadline: aborting the signal sends exec.cancel; the run still ends with the
    // execution's own terminal result (classification cancelled).
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), args.deadlineMs);
    let executionId = "";
    const terminal = await client
      .run(args.argv, {
        workspace: args.workspace,
        cwd: args.workspace,
        cleanEnv: true,
        env: ["PATH"],
        identity: { workspace_id: workspaceId, session_id: session },
        authority: { grant_id: grant.id, lease_id: leaseId },
        signal: deadline.signal,
        onStart: (s) => {
          executionId = s.execution_id;
        },
        onOutput: (stream, data) =>
          (stream === "stderr" ? process.stderr : process.stdout).write(data),
      })
      .finally(() => clearTimeout(timer));
    const summary = {
      execution_id: executionId,
      grant_id: grant.id,
      classification: terminal.classification,
      exit: terminal.exit,
      trigger: terminal.trigger,
      deadline_hit: deadline.signal.aborted,
    };
    process.stdout.write(`${JSON.stringify(summary)}\n`);
    return exitCode(terminal);
  } finally {
    if (leaseId !== undefined)
      await client.leaseRelease({ lease_id: leaseId }).catch(() => undefined);
    await client.authorityRevoke({ grant_id: grant.id }).catch(() => undefined);
    client.close();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    if (e instanceof CustosError) {
      process.stderr.write(`agent-runner: ${e.code} (${e.recovery}): ${e.message}\n`);
      process.exitCode = e.code === "rpc.unavailable" ? 75 : 65;
    } else {
      process.stderr.write(`agent-runner: ${e instanceof Error ? e.message : String(e)}\n`);
      process.exitCode = 64;
    }
  },
);
