// The defaults client.run shares with `custos run` (docs/cli.md): the socket, the executable,
// the workspace and cwd, the identity and the environment. No daemon needed.
import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import { CustosError, buildRunParams, defaultSocketPath } from "../src";

let tmp: string;
const saved = { cwd: process.cwd(), env: { ...process.env } };

before(() => {
  tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "custos-ts-defaults-")));
});
after(() => {
  process.chdir(saved.cwd);
  process.env = saved.env;
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe("defaults", () => {
  it("socket: $CUSTOS_SOCKET, else ./.custos/custos.sock if there, else /run/custos", async () => {
    process.chdir(tmp);
    process.env.CUSTOS_SOCKET = "/somewhere/else.sock";
    assert.equal(defaultSocketPath(), "/somewhere/else.sock");
    delete process.env.CUSTOS_SOCKET;
    assert.equal(defaultSocketPath(), "/run/custos/custos.sock");
    fs.mkdirSync(path.join(tmp, ".custos"));
    const server = net.createServer().listen(path.join(tmp, ".custos", "custos.sock"));
    await new Promise((r) => server.once("listening", r));
    try {
      assert.equal(defaultSocketPath(), path.join(tmp, ".custos", "custos.sock"));
    } finally {
      server.close();
      process.chdir(saved.cwd);
    }
  });

  it("executable through PATH, argv[0] as typed; workspace and cwd: the current dir", () => {
    process.chdir(tmp);
    try {
      fs.mkdirSync(path.join(tmp, "sub"), { recursive: true });
      const p = buildRunParams(["sh", "-c", "true"], { cwd: "sub" });
      assert.equal(path.isAbsolute(p.plan.command.executable), true);
      assert.equal(path.basename(p.plan.command.executable), "sh");
      assert.deepEqual(p.plan.command.argv, ["sh", "-c", "true"]);
      assert.equal(p.plan.workspace.root, tmp);
      assert.equal(p.plan.workspace.access, "writable");
      assert.equal(p.plan.cwd, "sub");
      assert.equal(buildRunParams(["sh"]).plan.cwd, ".");
      assert.equal(buildRunParams(["sh"], { readOnly: true }).plan.workspace.access, "read_only");
      // A name with '/' is relative to the current directory.
      fs.writeFileSync(path.join(tmp, "tool"), "#!/bin/sh\n", { mode: 0o755 });
      assert.equal(buildRunParams(["./tool"]).plan.command.executable, path.join(tmp, "tool"));
      assert.throws(
        () => buildRunParams(["./absent"]),
        (e: unknown) => e instanceof CustosError && e.code === "plan.invalid_executable",
      );
      assert.throws(() => buildRunParams([]), { code: "plan.empty_argv" });
    } finally {
      process.chdir(saved.cwd);
    }
  });

  it("identity: session cli-<uid>, ids cli, generation 0, fresh run and action ids", () => {
    const a = buildRunParams(["sh"]);
    const b = buildRunParams(["sh"], { identity: { session_id: "s9", generation: 4 } });
    const uid = process.getuid?.() ?? 0;
    assert.equal(a.identity.session_id, `cli-${uid}`);
    for (const k of ["project_id", "workspace_id", "resource_id", "environment_id"] as const) {
      assert.equal(a.identity[k], "cli");
    }
    assert.equal(a.identity.generation, 0);
    assert.notEqual(a.identity.action_id, b.identity.action_id);
    assert.notEqual(a.identity.run_id, b.identity.run_id);
    assert.equal(b.identity.session_id, "s9");
    assert.equal(b.identity.generation, 4);
    assert.deepEqual(a.authority, { epoch: 0, grant_id: null, lease_id: null });
  });

  it("environment: default names when set, NAME and NAME=VALUE, cleanEnv", () => {
    process.env = { PATH: "/usr/bin:/bin", HOME: "/root", LANG: "C" };
    try {
      const names = (p: ReturnType<typeof buildRunParams>) => p.plan.env ?? [];
      assert.deepEqual(names(buildRunParams(["sh"])), [
        { name: "PATH", inherit: true },
        { name: "HOME", inherit: true },
        { name: "LANG", inherit: true },
      ]);
      assert.deepEqual(
        names(buildRunParams(["sh"], { env: ["HOME=/tmp", "CI"], cleanEnv: false })),
        [
          { name: "PATH", inherit: true },
          { name: "LANG", inherit: true },
          { name: "CI", inherit: true },
          { name: "HOME", value: "/tmp" },
        ],
      );
      assert.deepEqual(names(buildRunParams(["sh"], { cleanEnv: true, env: ["X=1"] })), [
        { name: "X", value: "1" },
      ]);
      assert.deepEqual(
        names(buildRunParams(["sh"], { plan: { sandbox: { environment: { allow: ["LANG"] } } } })),
        [{ name: "LANG", inherit: true }],
      );
    } finally {
      process.env = { ...saved.env };
    }
  });

  it("timeout: seconds, the plan's wall_ms", () => {
    assert.deepEqual(buildRunParams(["sh"], { timeout: 2.5 }).plan.limits, { wall_ms: 2500 });
    assert.deepEqual(
      buildRunParams(["sh"], { timeout: 1, plan: { limits: { cpu_ms: 5 } } }).plan.limits,
      {
        cpu_ms: 5,
        wall_ms: 1000,
      },
    );
    assert.equal(buildRunParams(["sh"]).plan.limits, undefined);
  });
});
