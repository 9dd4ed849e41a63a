// The client's copy of the API contract: every method of docs/openrpc.json with its params
// (true = required), and the members of the request schemas the params refer to.
//
// Two checks keep it from drifting: the assertions below fail the build when a params
// interface of types.ts differs from this table (names or required-ness), and
// test/contract.test.ts compares this table with docs/openrpc.json in both directions.
import type { Authority, Identity, MethodName, MethodParams, Plan } from "./types";

/** A method's params: name → required. */
export type ParamTable = { readonly [param: string]: boolean };

export interface MethodSpec {
  /** The Client method that calls it (the API name in camelCase). */
  readonly fn: string;
  readonly params: ParamTable;
}

export const METHODS = {
  "host.info": { fn: "hostInfo", params: {} },
  "host.gc": { fn: "hostGc", params: {} },
  "exec.check": {
    fn: "execCheck",
    params: { identity: true, plan: true, authority: false, subscribe: false },
  },
  "exec.start": {
    fn: "execStart",
    params: { identity: true, plan: true, authority: false, subscribe: false },
  },
  "exec.get": { fn: "execGet", params: { execution_id: true } },
  "exec.list": {
    fn: "execList",
    params: { phase: false, session_id: false, limit: false, cursor: false },
  },
  "exec.wait": { fn: "execWait", params: { execution_id: true, timeout_ms: false } },
  "exec.cancel": { fn: "execCancel", params: { execution_id: true, reason: false, force: false } },
  "exec.input": { fn: "execInput", params: { execution_id: true, data_b64: false, eof: false } },
  "exec.resize": { fn: "execResize", params: { execution_id: true, rows: true, cols: true } },
  "exec.subscribe": { fn: "execSubscribe", params: { execution_id: true, from_seq: false } },
  "exec.unsubscribe": { fn: "execUnsubscribe", params: { subscription: true } },
  "exec.output": {
    fn: "execOutput",
    params: { execution_id: true, stream: true, offset: false, max_bytes: false },
  },
  "authority.grant": {
    fn: "authorityGrant",
    params: {
      principal: true,
      id: false,
      role: false,
      operations: false,
      executables: false,
      workspaces: false,
      containers: false,
      environment_ids: false,
      resource_ids: false,
      inherit_env: false,
      literal_env: false,
      run_as_uids: false,
      ceilings: false,
      budget: false,
      sandbox: false,
      expires_ns: false,
    },
  },
  "authority.revoke": { fn: "authorityRevoke", params: { grant_id: true } },
  "authority.list": { fn: "authorityList", params: { grant_id: false, principal: false } },
  "lease.acquire": { fn: "leaseAcquire", params: { workspace_id: true, holder_session: true } },
  "lease.release": { fn: "leaseRelease", params: { lease_id: true, break: false } },
  "lease.list": { fn: "leaseList", params: { active_only: false } },
  "holder.quiescence": {
    fn: "holderQuiescence",
    params: { session_id: true, generation: true, actor: false },
  },
  "secret.set": { fn: "secretSet", params: { name: true, value_b64: true } },
  "secret.list": { fn: "secretList", params: {} },
  "secret.delete": { fn: "secretDelete", params: { name: true } },
} as const satisfies { readonly [M in MethodName]: MethodSpec };

/** Members of the request schemas (docs/openrpc.json components.schemas) → required. */
export const SCHEMAS = {
  Identity: {
    project_id: true,
    session_id: true,
    run_id: true,
    attempt_id: true,
    turn_id: true,
    action_id: true,
    process_id: true,
    workspace_id: true,
    resource_id: true,
    environment_id: true,
    generation: true,
    revision: true,
  },
  Plan: {
    command: true,
    workspace: true,
    cwd: false,
    env: false,
    io: false,
    limits: false,
    output: false,
    escalation: false,
    user: false,
    sandbox: false,
    backend: false,
  },
  Authority: {
    epoch: false,
    grant_id: false,
    grant_revision: false,
    lease_id: false,
    lease_epoch: false,
    plan_digest: false,
  },
} as const;

// ---------------------------------------------------------------------------------------------
// Compile-time agreement of types.ts with the tables above.

type RequiredKeys<T> = { [K in keyof T]-?: {} extends Pick<T, K> ? never : K }[keyof T];
type TableRequired<P> = { [K in keyof P]: P[K] extends true ? K : never }[keyof P];
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type Agrees<T, P> =
  Same<keyof T, keyof P> extends true ? Same<RequiredKeys<T>, TableRequired<P>> : false;

type Methods = typeof METHODS;
type MethodMismatch = {
  [M in MethodName]: Agrees<MethodParams[M], Methods[M]["params"]> extends true ? never : M;
}[MethodName];
type SchemaMismatch =
  | (Agrees<Identity, typeof SCHEMAS.Identity> extends true ? never : "Identity")
  | (Agrees<Plan, typeof SCHEMAS.Plan> extends true ? never : "Plan")
  | (Agrees<Authority, typeof SCHEMAS.Authority> extends true ? never : "Authority");

// A mismatch makes the type below the name of the offending method or schema, and `true` is not
// assignable to it: the build fails naming it.
export const typesAgreeWithContract: [MethodMismatch | SchemaMismatch] extends [never]
  ? true
  : MethodMismatch | SchemaMismatch = true;
