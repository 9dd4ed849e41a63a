// The wire shapes of the custos JSON-RPC API (docs/api.md, docs/openrpc.json).
//
// Params interfaces list exactly the params of docs/openrpc.json (contract.ts checks that at
// compile time against its method table, and a test checks the table against openrpc.json).
// Result interfaces name the fields the contract guarantees and keep the rest open: the daemon
// may add fields (docs/api.md, "Versioning").

/** An object whose other members are kept as sent. */
export interface Open {
  [key: string]: unknown;
}

// ---------------------------------------------------------------------------------------------
// Request parts

/** The twelve identity members of exec.start / exec.check (all required). */
export interface Identity {
  project_id: string;
  session_id: string;
  run_id: string;
  attempt_id: string;
  turn_id: string;
  action_id: string;
  process_id: string;
  workspace_id: string;
  resource_id: string;
  environment_id: string;
  generation: number;
  revision: number;
}

export interface EnvEntry {
  name: string;
  /** The daemon's value of `name` (its environment at start), never the caller's. */
  inherit?: boolean;
  value?: string;
}

export type Limit = number | "unlimited";

/** The plan of exec.start / exec.check; only `command` and `workspace` are required. */
export interface Plan {
  command: { executable: string; argv: string[] };
  workspace: { root: string; access?: "read_only" | "writable" };
  cwd?: string;
  env?: EnvEntry[];
  io?: { mode: "pipes" | "pty"; rows?: number; cols?: number; resize?: boolean };
  limits?: { [name: string]: Limit };
  output?: {
    chunk_bytes?: number;
    retained_bytes?: number;
    spool_bytes?: number;
    max_events?: number;
    on_limit?: "truncate" | "cancel";
  };
  escalation?: { signal?: string; grace_ms?: number; kill_after_ms?: number };
  user?: { uid: number; gid: number; groups?: number[] };
  /** docs/sandbox.md */
  sandbox?: Open;
  backend?: Open & { kind: "native" | "reference" | "docker" | "podman" };
}

/** The authority a caller claims; `grant_id: null` is the admin's implicit authority. */
export interface Authority {
  epoch?: number;
  grant_id?: string | null;
  grant_revision?: number | null;
  lease_id?: string | null;
  lease_epoch?: number | null;
  plan_digest?: string | null;
}

// ---------------------------------------------------------------------------------------------
// Params, one interface per method

export type NoParams = Record<never, never>;

export interface ExecStartParams {
  identity: Identity;
  plan: Plan;
  authority?: Authority | null;
  /** true: the answer is followed on this connection by every exec.event, terminal last. */
  subscribe?: boolean | null;
}
export type ExecCheckParams = ExecStartParams;
export interface ExecIdParams {
  execution_id: string;
}
export interface ExecListParams {
  phase?: string;
  session_id?: string;
  limit?: number;
  cursor?: string | null;
}
export interface ExecWaitParams {
  execution_id: string;
  timeout_ms?: number;
}
export interface ExecCancelParams {
  execution_id: string;
  reason?: string;
  /** Skip what is left of the graceful stop: the tree is killed now. */
  force?: boolean | null;
}
export interface ExecInputParams {
  execution_id: string;
  data_b64?: string;
  eof?: boolean;
}
export interface ExecResizeParams {
  execution_id: string;
  rows: number;
  cols: number;
}
export interface ExecSubscribeParams {
  execution_id: string;
  from_seq?: number;
}
export interface ExecUnsubscribeParams {
  subscription: string;
}
export type Stream = "stdout" | "stderr" | "pty";
export interface ExecOutputParams {
  execution_id: string;
  stream: Stream;
  offset?: number;
  max_bytes?: number;
}
/** The grant spec (docs/authority.md). */
export interface AuthorityGrantParams {
  principal: string;
  id?: string;
  role?: "runner" | "observer";
  operations?: Array<"exec.native" | "exec.reference" | "exec.docker" | "exec.podman">;
  executables?: Array<{ path: string; prefix?: boolean }>;
  workspaces?: Array<{ workspace_id: string; root: string; max_access?: "read_only" | "writable" }>;
  containers?: Array<{ engine: "docker" | "podman"; name: string; socket?: string }>;
  environment_ids?: string[];
  resource_ids?: string[];
  inherit_env?: string[];
  literal_env?: boolean;
  run_as_uids?: number[];
  ceilings?: { [limit: string]: Limit };
  budget?: { executions?: number | null; cpu_ms?: number | null; wall_ms?: number | null };
  /** The grant's sandbox contract: the shape of a plan's `sandbox` (docs/sandbox.md). */
  sandbox?: { [domain: string]: unknown };
  expires_ns?: number;
}
export interface AuthorityRevokeParams {
  grant_id: string;
}
export interface AuthorityListParams {
  grant_id?: string;
  principal?: string;
}
export interface LeaseAcquireParams {
  workspace_id: string;
  holder_session: string;
}
export interface LeaseReleaseParams {
  lease_id: string;
  break?: boolean;
}
export interface LeaseListParams {
  active_only?: boolean;
}
export interface HolderQuiescenceParams {
  session_id: string;
  generation: number;
  actor?: string;
}
export interface SecretSetParams {
  name: string;
  value_b64: string;
}
export interface SecretDeleteParams {
  name: string;
}

// ---------------------------------------------------------------------------------------------
// Results

export interface StreamAccounting extends Open {
  observed: number;
  retained: number;
  dropped: number;
  complete: boolean;
}

export type Classification =
  | "exited"
  | "signaled"
  | "spawn_failed"
  | "cancelled"
  | "timed_out"
  | "output_limit"
  | "resource_limit"
  | "sandbox_denied"
  | "supervisor_failed"
  | "recovery_indeterminate";

/** The terminal result (docs/api.md, "The terminal result"). */
export interface Terminal extends Open {
  classification: Classification;
  recovery?: string;
  exit: { code: number | null; signal: number | null };
  trigger: string | null;
  escalation?: Open;
  output: { [stream: string]: StreamAccounting };
  resources?: Open;
  tree: Open & { boundary?: string; cleanup?: "confirmed" | "unconfirmed"; containment?: string };
  spawn_error?: Open | null;
  observations?: Open;
  digest: string;
}

export interface HostInfo extends Open {
  version: string;
  boot_id: string;
  default_boundary: "cgroup" | "marker";
  pid: number;
  started_ns: number;
  capabilities: Open;
  cgroup_subtree?: string;
  shutdown_policy: string;
  restart_policy: string;
  registry: Open;
  backends: Open[];
  engines: Open[];
  handover: (Open & { count: number; fallback: boolean; reason: string }) | null;
  handover_refused: (Open & { at_ns: number; reason: string }) | null;
  descriptor_store: (Open & { stored: number; failures: number; restored: number }) | null;
}

export interface ExecCheckResult extends Open {
  plan_digest: string;
  sandbox_digest: string | null;
  backend: string;
  admission: Open & { admitted: boolean; missing: string[] };
  sandbox?: Open;
}

export interface ExecStartResult extends Open {
  execution_id: string;
  plan_digest: string;
  sandbox_digest?: string | null;
  phase: string;
  boundary: "cgroup" | "marker" | "reference";
  pid: number;
  subscription?: string | null;
  replay_from?: number;
}

export interface ExecutionView extends Open {
  execution_id: string;
  phase: string;
  terminal?: Terminal;
}

export interface ExecListResult extends Open {
  executions: ExecutionView[];
  next_cursor: string | null;
}
export interface ExecCancelResult extends Open {
  accepted: boolean;
  trigger: string | null;
  forced: boolean;
}
/** What `host.gc` published and removed, and what the output store holds after it. */
export interface HostGcResult extends Open {
  executions_retried: number;
  streams_published: number;
  streams_failed: number;
  artifacts_removed: number;
  spools_removed: number;
  bytes_freed: number;
  store: Open;
}
export interface ExecInputResult extends Open {
  accepted_bytes: number;
}
export interface ExecSubscribeResult extends Open {
  subscription: string;
  replay_from?: number;
}
export interface ExecOutputResult extends Open {
  data_b64: string;
  eof: boolean;
  complete: boolean;
}
export interface AuthorityGrantResult extends Open {
  grant: Open & { id: string };
  epoch: number;
}
export interface AuthorityRevokeResult extends Open {
  grant: Open;
  fenced: string[];
  epoch: number;
}
export interface AuthorityListResult extends Open {
  epoch: number;
  grants: Open[];
}
export interface LeaseResult extends Open {
  lease_id: string;
  epoch: number;
  lease: Open;
  authority_epoch: number;
}
export interface LeaseReleaseResult extends LeaseResult {
  fenced: string[];
}
export interface LeaseListResult extends Open {
  leases: Open[];
}
export interface HolderQuiescenceResult extends Open {
  quiescent: boolean;
  evidence?: Open;
  blocking?: Array<{ execution_id: string; reason: string }>;
}
export interface SecretNameResult extends Open {
  name: string;
}
export interface SecretListResult extends Open {
  secrets: Open[];
}

/** The params of an exec.event notification (docs/api.md, "Events"). */
export interface ExecEvent extends Open {
  subscription: string;
  execution_id: string;
  seq: number;
  plan_digest: string;
  sandbox_digest?: string | null;
  kind:
    | "started"
    | "adopted"
    | "output"
    | "input_closed"
    | "limit"
    | "cancel_requested"
    | "signal_sent"
    | "exited"
    | "closed"
    | "terminal";
  /** Events of this subscription lost just before this one (slow reader). */
  dropped?: number;
  /** kind "output" */
  stream?: Stream;
  offset?: number;
  data_b64?: string;
  /** kind "terminal" */
  terminal?: Terminal;
}

// ---------------------------------------------------------------------------------------------
// Every method: params and result

export interface MethodParams {
  "host.info": NoParams;
  "host.gc": NoParams;
  "exec.check": ExecCheckParams;
  "exec.start": ExecStartParams;
  "exec.get": ExecIdParams;
  "exec.list": ExecListParams;
  "exec.wait": ExecWaitParams;
  "exec.cancel": ExecCancelParams;
  "exec.input": ExecInputParams;
  "exec.resize": ExecResizeParams;
  "exec.subscribe": ExecSubscribeParams;
  "exec.unsubscribe": ExecUnsubscribeParams;
  "exec.output": ExecOutputParams;
  "authority.grant": AuthorityGrantParams;
  "authority.revoke": AuthorityRevokeParams;
  "authority.list": AuthorityListParams;
  "lease.acquire": LeaseAcquireParams;
  "lease.release": LeaseReleaseParams;
  "lease.list": LeaseListParams;
  "holder.quiescence": HolderQuiescenceParams;
  "secret.set": SecretSetParams;
  "secret.list": NoParams;
  "secret.delete": SecretDeleteParams;
}

export interface MethodResults {
  "host.info": HostInfo;
  "host.gc": HostGcResult;
  "exec.check": ExecCheckResult;
  "exec.start": ExecStartResult;
  "exec.get": ExecutionView;
  "exec.list": ExecListResult;
  "exec.wait": Terminal;
  "exec.cancel": ExecCancelResult;
  "exec.input": ExecInputResult;
  "exec.resize": Record<string, never>;
  "exec.subscribe": ExecSubscribeResult;
  "exec.unsubscribe": Record<string, never>;
  "exec.output": ExecOutputResult;
  "authority.grant": AuthorityGrantResult;
  "authority.revoke": AuthorityRevokeResult;
  "authority.list": AuthorityListResult;
  "lease.acquire": LeaseResult;
  "lease.release": LeaseReleaseResult;
  "lease.list": LeaseListResult;
  "holder.quiescence": HolderQuiescenceResult;
  "secret.set": SecretNameResult;
  "secret.list": SecretListResult;
  "secret.delete": SecretNameResult;
}

export type MethodName = keyof MethodParams;
