// Typed errors: the daemon's stable code and recovery class (docs/api.md, "Errors carry a
// stable code"), and the same shape for what fails on this side of the socket.

/** What a caller should do about an error (include/custos/core/error.hpp, `Recovery`). */
export type Recovery =
  | "caller_correction"
  | "reauthorize"
  | "preparation_retry"
  | "cancel_reap"
  | "reopen_reconcile"
  | "quarantine"
  | "publication_retry"
  | "terminal";

export interface Diagnostic {
  code: string;
  pointer: string;
  message: string;
}

/** `data.detail` of an error: `context`, and `errno`, `diagnostics`, `missing` when they apply. */
export interface ErrorDetail {
  context?: string;
  errno?: number;
  diagnostics?: Diagnostic[];
  missing?: string[];
  [key: string]: unknown;
}

/** Any failure of a call: an error answer of the daemon, or no daemon to answer it. */
export class CustosError extends Error {
  /** The stable code, e.g. `auth.denied`, `exec.not_found`, `rpc.unavailable`. Branch on it. */
  readonly code: string;
  readonly recovery: Recovery | string;
  readonly detail: ErrorDetail;
  /** The JSON-RPC error number (-32000 - layer, or a standard one); absent for local errors. */
  readonly rpcCode: number | undefined;

  constructor(
    code: string,
    recovery: Recovery | string,
    message: string,
    detail: ErrorDetail = {},
    rpcCode?: number,
  ) {
    super(`${code}: ${message}`);
    this.name = "CustosError";
    this.code = code;
    this.recovery = recovery;
    this.detail = detail;
    this.rpcCode = rpcCode;
  }

  /** The error a JSON-RPC error object carries. */
  static fromRpc(error: unknown): CustosError {
    const e = isObject(error) ? error : {};
    const data = isObject(e.data) ? e.data : {};
    const rpcCode = typeof e.code === "number" ? e.code : undefined;
    const message = typeof e.message === "string" ? e.message : "error without a message";
    const code = typeof data.code === "string" ? data.code : standardCode(rpcCode);
    const recovery = typeof data.recovery === "string" ? data.recovery : "terminal";
    const detail = isObject(data.detail) ? (data.detail as ErrorDetail) : {};
    const context =
      typeof detail.context === "string" && detail.context !== "" ? detail.context : "";
    return new CustosError(code, recovery, context || message, detail, rpcCode);
  }
}

/** No daemon answers (connect failed, or the connection was lost): retry as is later. */
export function unavailable(message: string, cause?: NodeJS.ErrnoException): CustosError {
  const detail: ErrorDetail = { context: message };
  // Node reports errno negated (-2 for ENOENT); the daemon's detail.errno is the positive one.
  if (typeof cause?.errno === "number") detail.errno = Math.abs(cause.errno);
  return new CustosError("rpc.unavailable", "preparation_retry", message, detail);
}

/** A request this client refuses before sending it. */
export function callerError(code: string, message: string, pointer?: string): CustosError {
  const detail: ErrorDetail = { context: message };
  if (pointer !== undefined) detail.diagnostics = [{ code, pointer, message }];
  return new CustosError(code, "caller_correction", message, detail);
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

// The standard JSON-RPC errors carry data.code too; this covers an answer that lacks it.
function standardCode(n: number | undefined): string {
  switch (n) {
    case -32700:
      return "rpc.parse_error";
    case -32600:
      return "rpc.invalid_request";
    case -32601:
      return "rpc.method_not_found";
    case -32602:
      return "rpc.invalid_params";
    default:
      return "internal.error";
  }
}
