// The custos client: one connection to the daemon, shared by every call, opened on first use
// and opened again after the daemon closed it (an idle connection is closed after
// idle-timeout-ms, docs/api.md).
import { Connection } from "./connection";
import { defaultSocketPath } from "./defaults";
import { CustosError, unavailable } from "./errors";
import { RECONNECT_BUDGET_MS, runExecution, type RunOptions } from "./run";
import type * as T from "./types";

export interface ClientOptions {
  /**
   * The daemon's socket; default as the CLI's: $CUSTOS_SOCKET, else ./.custos/custos.sock when
   * it exists, else /run/custos/custos.sock.
   */
  socketPath?: string;
}

export interface EventsOptions {
  /** The first seq wanted (inclusive); default 1. */
  fromSeq?: number;
}

export class Client {
  readonly socketPath: string;
  private current: Connection | null = null;
  private opening: Promise<Connection> | null = null;
  private isClosed = false;

  constructor(options: ClientOptions = {}) {
    this.socketPath = options.socketPath ?? defaultSocketPath();
  }

  /** Any method by name: resolves with its result, rejects with a CustosError. */
  call<M extends T.MethodName>(method: M, params: T.MethodParams[M]): Promise<T.MethodResults[M]>;
  call(method: string, params?: object | unknown[]): Promise<unknown>;
  async call(method: string, params?: object | unknown[]): Promise<unknown> {
    const conn = await this.connection();
    return conn.request(method, params ?? {});
  }

  hostInfo(): Promise<T.HostInfo> {
    return this.call("host.info", {});
  }
  /** Retries unfinished output publications, then applies the retention policy (admins). */
  hostGc(): Promise<T.HostGcResult> {
    return this.call("host.gc", {});
  }
  execCheck(params: T.ExecCheckParams): Promise<T.ExecCheckResult> {
    return this.call("exec.check", params);
  }
  /**
   * With `subscribe: true` the events follow on this connection; client.run reads them. Events
   * of a subscription nobody reads are held until close().
   */
  execStart(params: T.ExecStartParams): Promise<T.ExecStartResult> {
    return this.call("exec.start", params);
  }
  execGet(params: T.ExecIdParams): Promise<T.ExecutionView> {
    return this.call("exec.get", params);
  }
  execList(params: T.ExecListParams = {}): Promise<T.ExecListResult> {
    return this.call("exec.list", params);
  }
  execWait(params: T.ExecWaitParams): Promise<T.Terminal> {
    return this.call("exec.wait", params);
  }
  execCancel(params: T.ExecCancelParams): Promise<T.ExecCancelResult> {
    return this.call("exec.cancel", params);
  }
  execInput(params: T.ExecInputParams): Promise<T.ExecInputResult> {
    return this.call("exec.input", params);
  }
  execResize(params: T.ExecResizeParams): Promise<Record<string, never>> {
    return this.call("exec.resize", params);
  }
  /** The events follow as notifications, held until close(); client.events reads them. */
  execSubscribe(params: T.ExecSubscribeParams): Promise<T.ExecSubscribeResult> {
    return this.call("exec.subscribe", params);
  }
  execUnsubscribe(params: T.ExecUnsubscribeParams): Promise<Record<string, never>> {
    return this.call("exec.unsubscribe", params);
  }
  execOutput(params: T.ExecOutputParams): Promise<T.ExecOutputResult> {
    return this.call("exec.output", params);
  }
  authorityGrant(params: T.AuthorityGrantParams): Promise<T.AuthorityGrantResult> {
    return this.call("authority.grant", params);
  }
  authorityRevoke(params: T.AuthorityRevokeParams): Promise<T.AuthorityRevokeResult> {
    return this.call("authority.revoke", params);
  }
  authorityList(params: T.AuthorityListParams = {}): Promise<T.AuthorityListResult> {
    return this.call("authority.list", params);
  }
  leaseAcquire(params: T.LeaseAcquireParams): Promise<T.LeaseResult> {
    return this.call("lease.acquire", params);
  }
  leaseRelease(params: T.LeaseReleaseParams): Promise<T.LeaseReleaseResult> {
    return this.call("lease.release", params);
  }
  leaseList(params: T.LeaseListParams = {}): Promise<T.LeaseListResult> {
    return this.call("lease.list", params);
  }
  holderQuiescence(params: T.HolderQuiescenceParams): Promise<T.HolderQuiescenceResult> {
    return this.call("holder.quiescence", params);
  }
  secretSet(params: T.SecretSetParams): Promise<T.SecretNameResult> {
    return this.call("secret.set", params);
  }
  secretList(): Promise<T.SecretListResult> {
    return this.call("secret.list", {});
  }
  secretDelete(params: T.SecretDeleteParams): Promise<T.SecretNameResult> {
    return this.call("secret.delete", params);
  }

  /**
   * Runs `argv` as `custos run -- argv` would (same defaults) and resolves with the terminal
   * result once every byte of output went to `onOutput`. Across a daemon handover the run
   * connects again and resumes its events (`onReconnect` hears of it).
   */
  run(argv: readonly string[], options: RunOptions = {}): Promise<T.Terminal> {
    return runExecution(this, argv, options);
  }

  /**
   * The execution's exec.event notifications from `fromSeq` (exec.subscribe), ending after the
   * terminal event. Leaving the loop early ends the subscription (exec.unsubscribe). Events the
   * daemon dropped for a slow reader show as a gap in `seq` and a `dropped` count.
   */
  async *events(
    executionId: string,
    options: EventsOptions = {},
  ): AsyncGenerator<T.ExecEvent, void, undefined> {
    const conn = await this.connection();
    const { subscription } = (await conn.request("exec.subscribe", {
      execution_id: executionId,
      from_seq: options.fromSeq ?? 1,
    })) as T.ExecSubscribeResult;
    let complete = false;
    try {
      for await (const ev of conn.claim(subscription)) {
        complete = ev.kind === "terminal";
        yield ev;
        if (complete) return;
      }
    } finally {
      if (!complete) {
        conn.release(subscription);
        conn.request("exec.unsubscribe", { subscription }).catch(() => undefined);
      }
    }
  }

  /** Closes the connection: calls in flight fail with rpc.unavailable, later calls too. */
  close(): void {
    this.isClosed = true;
    this.current?.close();
    this.current = null;
  }

  /** @internal The open connection, opened (again) when there is none. */
  async connection(): Promise<Connection> {
    if (this.isClosed) throw unavailable("the client was closed");
    if (this.current !== null && !this.current.closed) return this.current;
    if (this.opening === null) {
      this.opening = Connection.open(this.socketPath).finally(() => {
        this.opening = null;
      });
    }
    const conn = await this.opening;
    if (this.isClosed) {
      conn.close();
      throw unavailable("the client was closed");
    }
    this.current = conn;
    return conn;
  }

  /**
   * @internal A connection other than `lost` (one a run lost: the daemon closed it, or said it
   * is going away): the current one if another caller opened it already, else a new one;
   * connects are retried with backoff for up to RECONNECT_BUDGET_MS while no daemon answers.
   */
  async reconnect(lost: Connection): Promise<Connection> {
    if (this.current === lost) {
      lost.close();
      this.current = null;
    }
    const deadline = Date.now() + RECONNECT_BUDGET_MS;
    let pause = 50;
    for (;;) {
      try {
        return await this.connection();
      } catch (e) {
        if (this.isClosed || !(e instanceof CustosError) || Date.now() + pause > deadline) throw e;
        await new Promise((resolve) => setTimeout(resolve, pause));
        pause = Math.min(pause * 2, 1000);
      }
    }
  }
}
