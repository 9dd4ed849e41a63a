// custos-client: the TypeScript client of the custos daemon (docs/api.md).
export { Client, type ClientOptions, type EventsOptions } from "./client";
export { CustosError, type Diagnostic, type ErrorDetail, type Recovery } from "./errors";
export { METHODS, SCHEMAS, type MethodSpec, type ParamTable } from "./contract";
export {
  DEFAULT_INHERIT,
  buildRunParams,
  defaultSocketPath,
  resolveExecutable,
  type RunPlanOptions,
} from "./defaults";
export { exitCode, succeeded } from "./result";
export { RECONNECT_BUDGET_MS, type ReconnectInfo, type RunOptions } from "./run";
export * from "./types";
