// examples/agent-runner, compiled, run for real against a live daemon: under its own grant and
// lease, streaming, and cancelled at its deadline.
import { strict as assert } from "node:assert";
import { spawn } from "node:child_process";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { Client } from "../src";
import { startDaemon, type TestDaemon } from "./daemon";

let d: TestDaemon;

before(async () => {
  d = await startDaemon();
});
after(async () => {
  await d?.stop();
});

const script = path.resolve(__dirname, "../examples/agent-runner.js");

function runExample(
  args: string[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [script, "--socket", d.socket, "--workspace", d.workspace, ...args],
      {
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (b: Buffer) => (stdout += b.toString()));
    child.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

function summary(stdout: string): Record<string, unknown> {
  const last = stdout.trimEnd().split("\n").at(-1) ?? "";
  return JSON.parse(last) as Record<string, unknown>;
}

describe("examples/agent-runner", () => {
  it("runs a tool call under its grant and streams its output", async () => {
    const r = await runExample([
      "--deadline-ms",
      "20000",
      "--",
      "sh",
      "-c",
      "echo tool-output; echo tool-warning >&2; exit 3",
    ]);
    assert.equal(r.code, 3, r.stderr);
    assert.match(r.stdout, /^tool-output\n/);
    assert.match(r.stderr, /tool-warning/);
    const s = summary(r.stdout);
    assert.equal(s.classification, "exited");
    assert.equal(s.deadline_hit, false);
    // The grant was the authority: the daemon's record of it shows the execution spent, and the
    // example revoked it at the end.
    const c = new Client({ socketPath: d.socket });
    try {
      const list = await c.authorityList({ grant_id: s.grant_id as string });
      const g = list.grants[0] as { revoked?: unknown; spent?: { executions?: number } };
      assert.ok(
        g.revoked !== false && g.revoked !== null && g.revoked !== undefined,
        JSON.stringify(g),
      );
      assert.equal(g.spent?.executions, 1, JSON.stringify(g));
    } finally {
      c.close();
    }
  });

  it("cancels the tool call at its deadline", async () => {
    const t0 = Date.now();
    const r = await runExample([
      "--deadline-ms",
      "700",
      "--",
      "sh",
      "-c",
      "echo working; exec sleep 30",
    ]);
    assert.equal(r.code, 125, r.stderr);
    assert.match(r.stdout, /^working\n/);
    const s = summary(r.stdout);
    assert.equal(s.classification, "cancelled");
    assert.equal(s.trigger, "user");
    assert.equal(s.deadline_hit, true);
    assert.ok(Date.now() - t0 < 20000);
  });
});
