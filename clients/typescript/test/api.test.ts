// The generated methods, client.events and typed errors against a live daemon.
import { strict as assert } from "node:assert";
import { spawnSync } from "node:child_process";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { Client, CustosError, type ExecEvent, buildRunParams } from "../src";
import { startDaemon, type TestDaemon } from "./daemon";

let d: TestDaemon;
let client: Client;

before(async () => {
  d = await startDaemon();
  client = new Client({ socketPath: d.socket });
});
after(async () => {
  client?.close();
  await d?.stop();
});

async function all(it: AsyncIterable<ExecEvent>): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const ev of it) out.push(ev);
  return out;
}

function params(argv: string[]) {
  return buildRunParams(argv, { workspace: d.workspace, cwd: d.workspace });
}

describe("methods", () => {
  it("hostInfo answers with the daemon's facts", async () => {
    const h = await client.hostInfo();
    assert.equal(typeof h.version, "string");
    assert.ok(h.pid > 0);
    assert.ok(h.default_boundary === "cgroup" || h.default_boundary === "marker");
    assert.ok(Array.isArray(h.backends));
  });

  it("matches concurrent calls by id: a slow exec.wait does not hold up host.info", async () => {
    const s = await client.execStart(params(["sleep", "1"]));
    const order: string[] = [];
    const wait = client.execWait({ execution_id: s.execution_id }).then((t) => {
      order.push("wait");
      return t;
    });
    await client.hostInfo().then(() => order.push("host"));
    const t = await wait;
    assert.deepEqual(order, ["host", "wait"]);
    assert.equal(t.classification, "exited");
  });

  it("exec.list, exec.get and exec.output see a finished execution", async () => {
    const s = await client.execStart(params(["sh", "-c", "printf hello"]));
    await client.execWait({ execution_id: s.execution_id });
    const view = await client.execGet({ execution_id: s.execution_id });
    assert.equal(view.execution_id, s.execution_id);
    assert.equal(view.terminal?.classification, "exited");
    const out = await client.execOutput({ execution_id: s.execution_id, stream: "stdout" });
    assert.equal(Buffer.from(out.data_b64, "base64").toString(), "hello");
    const list = await client.execList({ limit: 1000 });
    assert.ok(list.executions.some((e) => e.execution_id === s.execution_id));
  });
});

describe("client.events", () => {
  it("replays from seq 1 and ends after the terminal event", async () => {
    const s = await client.execStart(params(["sh", "-c", "echo a; echo b >&2"]));
    await client.execWait({ execution_id: s.execution_id });
    const evs = await all(client.events(s.execution_id));
    assert.deepEqual(
      evs.map((e) => e.seq),
      evs.map((_, i) => i + 1),
    );
    assert.equal(evs[0]?.kind, "started");
    assert.equal(evs.at(-1)?.kind, "terminal");
    assert.equal(evs.at(-1)?.terminal?.classification, "exited");
    const text = evs
      .filter((e) => e.kind === "output")
      .map((e) => `${e.stream}:${Buffer.from(e.data_b64 ?? "", "base64").toString()}`)
      .sort();
    assert.deepEqual(text, ["stderr:b\n", "stdout:a\n"]);

    const later = await all(client.events(s.execution_id, { fromSeq: 3 }));
    assert.equal(later[0]?.seq, 3);
    assert.deepEqual(
      later.map((e) => e.seq),
      evs.slice(2).map((e) => e.seq),
    );
    assert.equal(later.at(-1)?.kind, "terminal");
  });

  it("follows a live execution to its end", async () => {
    const s = await client.execStart(params(["sh", "-c", "sleep 0.3; echo late"]));
    const evs = await all(client.events(s.execution_id));
    assert.equal(evs.at(-1)?.kind, "terminal");
    const out = evs.find((e) => e.kind === "output");
    assert.equal(Buffer.from(out?.data_b64 ?? "", "base64").toString(), "late\n");
  });

  it("leaving the loop early ends the subscription, the client goes on", async () => {
    const s = await client.execStart(params(["sleep", "30"]));
    for await (const ev of client.events(s.execution_id)) {
      assert.equal(ev.seq, 1);
      break;
    }
    const c = await client.execCancel({ execution_id: s.execution_id });
    assert.equal(c.accepted, true);
    const t = await client.execWait({ execution_id: s.execution_id });
    assert.equal(t.classification, "cancelled");
  });
});

describe("errors", () => {
  it("an unknown execution id is exec.not_found with its recovery class", async () => {
    await assert.rejects(client.execGet({ execution_id: "ex-does-not-exist" }), (e: unknown) => {
      assert.ok(e instanceof CustosError);
      assert.ok(e instanceof Error);
      assert.equal(e.code, "exec.not_found");
      assert.equal(e.recovery, "caller_correction");
      assert.equal(e.rpcCode, -32002);
      assert.equal(typeof e.detail, "object");
      return true;
    });
    await assert.rejects(client.events("ex-does-not-exist").next(), { code: "exec.not_found" });
  });

  it("bad params and unknown methods carry the standard codes", async () => {
    await assert.rejects(client.call("exec.get", {}), (e: unknown) => {
      assert.ok(e instanceof CustosError);
      assert.equal(e.code, "rpc.invalid_params");
      assert.equal(e.rpcCode, -32602);
      return true;
    });
    await assert.rejects(client.call("no.such_method", {}), { code: "rpc.method_not_found" });
    // The connection is still good.
    assert.equal(typeof (await client.hostInfo()).version, "string");
  });

  it("no daemon at the socket is rpc.unavailable", async () => {
    const lost = new Client({ socketPath: `${d.workspace}/no-daemon.sock` });
    await assert.rejects(lost.hostInfo(), (e: unknown) => {
      assert.ok(e instanceof CustosError);
      assert.equal(e.code, "rpc.unavailable");
      assert.equal(e.recovery, "preparation_retry");
      return true;
    });
    lost.close();
  });

  it("a script that never calls close() still exits once its calls are answered", async () => {
    const index = path.resolve(__dirname, "../src/index.js");
    const code = `const { Client } = require(${JSON.stringify(index)});
      new Client({ socketPath: ${JSON.stringify(d.socket)} }).hostInfo()
        .then((h) => console.log(h.version));`;
    const t0 = Date.now();
    const r = spawnSync(process.execPath, ["-e", code], { encoding: "utf8", timeout: 30000 });
    assert.equal(r.status, 0, r.stderr);
    assert.ok(r.stdout.trim().length > 0);
    assert.ok(Date.now() - t0 < 20000, "the open connection kept the process alive");
  });

  it("a closed client refuses further calls", async () => {
    const c = new Client({ socketPath: d.socket });
    await c.hostInfo();
    c.close();
    await assert.rejects(c.hostInfo(), { code: "rpc.unavailable" });
  });
});
