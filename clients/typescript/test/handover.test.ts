// client.run across a real daemon handover (SIGHUP: the daemon re-executes itself and closes
// every connection): the run reconnects, resumes its events and resolves once with the right
// result, with no output line delivered twice.
//
// The handover keeps the executions' pipes, so no line is lost either (the "gapless" test).
import { strict as assert } from "node:assert";
import { after, before, describe, it } from "node:test";

import { Client, type ReconnectInfo, type Terminal, exitCode } from "../src";
import { startDaemon, type TestDaemon } from "./daemon";

const LINES = "for i in $(seq 1 30); do echo line $i; sleep 0.1; done";
const ALL_LINES = Array.from({ length: 30 }, (_, i) => `line ${i + 1}`);
const HANGUP_AFTER_MS = 1200;

let d: TestDaemon;

before(async () => {
  d = await startDaemon();
});
after(async () => {
  await d?.stop();
});

async function handovers(): Promise<number> {
  const deadline = Date.now() + 20000;
  for (;;) {
    const c = new Client({ socketPath: d.socket });
    try {
      const info = (await c.hostInfo()) as { handover?: { count?: number } | null };
      return info.handover?.count ?? 0;
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      c.close();
    }
  }
}

interface Across {
  terminal: Terminal;
  lines: string[];
  reports: ReconnectInfo[];
  id: string;
  tookMs: number;
  handedOver: number;
}

/** Runs LINES with a SIGHUP to the daemon HANGUP_AFTER_MS into it. */
async function runAcrossHandover(): Promise<Across> {
  const before = await handovers();
  const client = new Client({ socketPath: d.socket });
  const out: Buffer[] = [];
  const reports: ReconnectInfo[] = [];
  let id = "";
  const timer = setTimeout(() => process.kill(d.pid, "SIGHUP"), HANGUP_AFTER_MS);
  const t0 = Date.now();
  try {
    const terminal = await client.run(["sh", "-c", LINES], {
      workspace: d.workspace,
      cwd: d.workspace,
      onStart: (s) => {
        id = s.execution_id;
      },
      onOutput: (stream, data) => {
        if (stream === "stdout") out.push(Buffer.from(data));
      },
      onReconnect: (info) => reports.push(info),
    });
    const tookMs = Date.now() - t0;
    const lines = Buffer.concat(out).toString().split("\n").filter((l) => l !== "");
    return { terminal, lines, reports, id, tookMs, handedOver: (await handovers()) - before };
  } finally {
    clearTimeout(timer);
    client.close();
  }
}

describe("client.run across a handover", () => {
  it("resolves once with the run's result, no line twice", async () => {
    let resolved = 0;
    const r = await runAcrossHandover().then((x) => {
      resolved++;
      return x;
    });
    assert.equal(resolved, 1);
    assert.equal(r.terminal.classification, "exited", `${JSON.stringify(r.terminal)}\n${d.log()}`);
    assert.equal(exitCode(r.terminal), 0);
    assert.equal(r.handedOver, 1);
    assert.ok(r.tookMs > HANGUP_AFTER_MS, "the run was under way at the handover");
    assert.ok(r.reports.length >= 1, "the run reconnected");
    for (const rep of r.reports) assert.equal(rep.executionId, r.id);
    assert.equal(r.lines[0], "line 1", r.lines.join("|"));
    for (const l of r.lines) assert.ok(ALL_LINES.includes(l), l);
    // In order, none twice (some may be missing until the handover keeps output).
    const numbers = r.lines.map((l) => Number(l.split(" ")[1]));
    assert.deepEqual(numbers, [...new Set(numbers)].sort((a, b) => a - b), r.lines.join("|"));
  });

  it("gapless output across a handover", async () => {
    const r = await runAcrossHandover();
    assert.equal(exitCode(r.terminal), 0);
    assert.deepEqual(r.lines, ALL_LINES);
    assert.ok(!r.reports.some((x) => x.gap), JSON.stringify(r.reports));
  });
});
