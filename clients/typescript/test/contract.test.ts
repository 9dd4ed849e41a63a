// The client's method table against docs/openrpc.json, both ways: every served method and
// every param (with its required-ness) is in the client, and the client has nothing extra.
import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";

import { Client, METHODS, SCHEMAS } from "../src";

interface OpenRpcParam {
  name: string;
  required?: boolean;
  schema?: { $ref?: string };
}
interface OpenRpc {
  methods: Array<{ name: string; params: OpenRpcParam[] }>;
  components: {
    schemas: Record<string, { required?: string[]; properties?: Record<string, unknown> }>;
  };
}

// dist/test/ → the repository's docs/ (or $CUSTOS_OPENRPC).
const docPath =
  process.env.CUSTOS_OPENRPC ?? path.resolve(__dirname, "../../../../docs/openrpc.json");
const doc = JSON.parse(fs.readFileSync(docPath, "utf8")) as OpenRpc;

const camel = (name: string) => name.replace(/[._]([a-z])/g, (_, c: string) => c.toUpperCase());
const sorted = (xs: Iterable<string>) => [...xs].sort();

describe("contract: docs/openrpc.json", () => {
  it("has the same methods as the client", () => {
    assert.deepEqual(sorted(Object.keys(METHODS)), sorted(doc.methods.map((m) => m.name)));
  });

  for (const m of doc.methods) {
    it(`${m.name}: same params, same required ones`, () => {
      const table = (METHODS as Record<string, { params: Record<string, boolean> }>)[m.name];
      assert.ok(table, `${m.name} is not in the client`);
      const want = Object.fromEntries(m.params.map((p) => [p.name, p.required === true]));
      assert.deepEqual(table.params, want);
    });
  }

  it("every schema a param refers to has the client's members", () => {
    const refs = new Set<string>();
    for (const m of doc.methods) {
      for (const p of m.params) {
        const ref = p.schema?.$ref;
        if (ref !== undefined) refs.add(ref.replace("#/components/schemas/", ""));
      }
    }
    assert.deepEqual(sorted(Object.keys(SCHEMAS)), sorted(refs));
    for (const name of refs) {
      const s = doc.components.schemas[name];
      assert.ok(s, `${name} missing from components.schemas`);
      const required = new Set(s.required ?? []);
      const want = Object.fromEntries(
        Object.keys(s.properties ?? {}).map((k) => [k, required.has(k)]),
      );
      assert.deepEqual((SCHEMAS as Record<string, unknown>)[name], want, name);
    }
  });

  it("each method is a Client method named in camelCase, and no other API method exists", () => {
    const own = new Set([
      "constructor",
      "call",
      "run",
      "events",
      "close",
      "connection",
      "reconnect",
    ]);
    const fns = Object.getOwnPropertyNames(Client.prototype).filter((n) => !own.has(n));
    const want = doc.methods.map((m) => camel(m.name));
    assert.deepEqual(sorted(fns), sorted(want));
    for (const [name, spec] of Object.entries(METHODS)) {
      assert.equal(spec.fn, camel(name));
      assert.equal(
        typeof (Client.prototype as unknown as Record<string, unknown>)[spec.fn],
        "function",
      );
    }
  });

  it("each method calls its own API method with the params it was given", async () => {
    const c = new Client({ socketPath: "/nonexistent/custos.sock" });
    const seen: Array<[string, unknown]> = [];
    c.call = (async (m: string, p?: object) => {
      seen.push([m, p]);
      return {};
    }) as typeof c.call;
    for (const [name, spec] of Object.entries(METHODS)) {
      const given = Object.keys(spec.params).length === 0 ? {} : { marker: name };
      seen.length = 0;
      await (c as unknown as Record<string, (p: unknown) => Promise<unknown>>)[spec.fn]!(given);
      assert.deepEqual(seen, [[name, given]], spec.fn);
    }
  });
});
