// client.run: one command as an owned execution, its output streamed, as `custos run` does it
// (src/cli/cmd_run.cpp).
//
// One request for the whole run: exec.start with `subscribe: true`, whose answer is followed on
// the same connection by every exec.event of the execution from seq 1, terminal last
// (docs/api.md). The terminal event is never dropped; output events the daemon dropped for a
// slow reader (a gap in the offsets), or evicted before the start was answered, are read back
// from the spool with exec.output by offset, so every byte reaches onOutput once, in order.
// exec.input (the `input` option) and exec.cancel (the `signal` option) are the only other calls.
//
// A daemon handover (SIGHUP, `custos daemon --reexec`) closes every connection; the run goes on
// over a new one, as `custos run` does (docs/cli.md, "Reconnecting"): the client connects again
// (retried for up to RECONNECT_BUDGET_MS), the run subscribes from the seq after the last one it
// handled (events up to it are skipped if they come again) and reports a `replay_from` past that
// seq as a gap (onReconnect, else a process warning); when the execution is already terminal, or
// a terminal event comes whose seq it had passed (a new image that numbered its events from 1
// again), the result is exec.wait's. The run resolves once.
import type { Connection } from "./connection";
import { buildRunParams, type RunPlanOptions } from "./defaults";
import { CustosError } from "./errors";
import type {
  ExecEvent,
  ExecOutputResult,
  ExecStartResult,
  ExecSubscribeResult,
  MethodName,
  MethodParams,
  MethodResults,
  ExecutionView,
  Stream,
  Terminal,
} from "./types";

/**
 * How long a run keeps trying to reach the daemon again after it closed the connection (a
 * handover), in milliseconds: connects are retried with backoff while the socket refuses them
 * or is absent, for at most this long in total (the CLI's kReconnectBudget).
 */
export const RECONNECT_BUDGET_MS = 30_000;

/** What a run reports after each reconnect. */
export interface ReconnectInfo {
  executionId: string;
  /** The seq the run asked the events from (the one after the last it handled). */
  fromSeq: number;
  /** Where the daemon's replay began (undefined when it no longer supervises the execution). */
  replayFrom: number | undefined;
  /** Events fromSeq..replayFrom-1 were not kept (output is still read back from the spool). */
  gap: boolean;
}

/** Whether `e` means the connection is gone and the call may be made again on a new one. */
export function connectionLost(e: unknown): boolean {
  return (
    e instanceof CustosError && (e.code === "rpc.unavailable" || e.code === "daemon.shutting_down")
  );
}

export interface RunOptions extends RunPlanOptions {
  /** Each piece of output as it arrives, in order per stream, every byte once. */
  onOutput?: (stream: Stream, data: Buffer) => void;
  /** The exec.start answer (execution_id, pid, boundary, ...), before any output. */
  onStart?: (started: ExecStartResult) => void;
  /** Aborting sends exec.cancel; the run still resolves with its terminal result (`cancelled`). */
  signal?: AbortSignal;
  /** Bytes for the program's stdin, then EOF. Without it stdin stays open (and unused). */
  input?: string | Uint8Array;
  /**
   * After each reconnect (a daemon handover): where the events were resumed, and whether some
   * were lost. Without it a gap is a process warning (`ReconnectGapWarning`).
   */
  onReconnect?: (info: ReconnectInfo) => void;
}

/** What run needs of the client. */
export interface RunHost {
  connection(): Promise<Connection>;
  /** A connection other than `lost`, connects retried for up to RECONNECT_BUDGET_MS. */
  reconnect(lost: Connection): Promise<Connection>;
  call<M extends MethodName>(method: M, params: MethodParams[M]): Promise<MethodResults[M]>;
}

/** Calls that survive the daemon closing the connection, and whether the run must subscribe
 * again (its connection changed). */
class Link {
  resubscribe = false;

  constructor(
    private readonly host: RunHost,
    public conn: Connection,
  ) {}

  async reconnect(): Promise<void> {
    this.conn = await this.host.reconnect(this.conn);
    this.resubscribe = true;
  }

  /**
   * A call that can be repeated (exec.output, exec.wait, exec.get), on the client's connection;
   * `here`: on the run's own (exec.subscribe, whose events must come to it).
   */
  async call<M extends MethodName>(
    method: M,
    params: MethodParams[M],
    here = false,
  ): Promise<MethodResults[M]> {
    for (;;) {
      try {
        if (here) return (await this.conn.request(method, params)) as MethodResults[M];
        return await this.host.call(method, params);
      } catch (e) {
        if (!connectionLost(e)) throw e;
        await this.reconnect();
      }
    }
  }
}

/** The most exec.output returns in one answer, and the most exec.input takes in one call. */
const OUTPUT_SLICE = 1 << 20;
const INPUT_CHUNK = 512 * 1024;

export async function runExecution(
  host: RunHost,
  argv: readonly string[],
  options: RunOptions = {},
): Promise<Terminal> {
  const params = buildRunParams(argv, options);
  const { signal } = options;
  if (signal?.aborted) throw signal.reason ?? new Error("aborted");
  const conn = await host.connection();
  const authority = params.authority;
  if (authority?.grant_id != null && options.authority?.epoch === undefined) {
    // A grant is checked against the current authority epoch: read it right before starting.
    const list = await host.call("authority.list", { grant_id: authority.grant_id });
    authority.epoch = list.epoch;
  }
  const started = (await conn.request("exec.start", {
    ...params,
    subscribe: true,
  })) as ExecStartResult;
  const id = started.execution_id;
  let subscription = started.subscription;
  if (typeof subscription !== "string") {
    // The daemon could not attach the events to the answer: the execution runs on, and its
    // events are asked for on their own.
    const again = (await conn.request("exec.subscribe", {
      execution_id: id,
      from_seq: 1,
    })) as ExecSubscribeResult;
    subscription = again.subscription;
  }
  let events = conn.claim(subscription);
  const link = new Link(host, conn);

  let finished = false;
  const onAbort = () => {
    host
      .call("exec.cancel", { execution_id: id, reason: "client.run: aborted" })
      .catch(() => undefined);
  };
  signal?.addEventListener("abort", onAbort, { once: true });
  if (signal?.aborted) onAbort();
  if (options.input !== undefined) {
    feedInput(host, id, Buffer.from(options.input), () => finished).catch(() => undefined);
  }

  const pty = (params.plan.io?.mode ?? "pipes") === "pty";
  const output = new OutputSink(link, id, options.onOutput);
  const streams: Stream[] = pty ? ["pty"] : ["stdout", "stderr"];
  let lastSeq = 0; // the highest seq handled
  try {
    options.onStart?.(started);
    for (;;) {
      if (link.resubscribe) {
        const again = await resubscribe(link, id, lastSeq, options);
        if (again.terminal !== undefined) {
          await output.drain(again.terminal, streams);
          return again.terminal;
        }
        subscription = again.subscription;
        events = link.conn.claim(subscription);
        if (signal?.aborted) onAbort(); // the cancel may have been lost with the connection
      }
      let next: IteratorResult<ExecEvent>;
      try {
        next = await events.next();
      } catch (e) {
        if (!connectionLost(e)) throw e;
        await link.reconnect();
        continue;
      }
      // The queue ended without a terminal event: only release() does that, and nobody else
      // holds this subscription.
      if (next.done) throw new Error("custos: the event stream ended before the terminal event");
      const ev = next.value;
      const seen = typeof ev.seq === "number" && ev.seq <= lastSeq;
      if (ev.kind === "terminal" && seen) {
        // A terminal event of an event log that started again after a handover.
        const terminal = await link.call("exec.wait", { execution_id: id });
        await output.drain(terminal, streams);
        return terminal;
      }
      if (seen) continue; // handled before the reconnect
      if (typeof ev.seq === "number") lastSeq = ev.seq;
      if (ev.kind === "output") {
        await output.onEvent(ev);
      } else if (ev.kind === "terminal") {
        let terminal = ev.terminal;
        if (terminal === undefined || typeof terminal.classification !== "string") {
          terminal = await link.call("exec.wait", { execution_id: id });
        }
        await output.drain(terminal, streams);
        return terminal;
      }
    }
  } catch (e) {
    link.conn.release(subscription);
    link.conn.request("exec.unsubscribe", { subscription }).catch(() => undefined);
    throw e;
  } finally {
    finished = true;
    signal?.removeEventListener("abort", onAbort);
  }
}

/**
 * After a reconnect: the subscription from the seq after `lastSeq`, or the terminal result when
 * the execution already has one (it ended meanwhile, or its event log started again below
 * `lastSeq`), or when the daemon no longer supervises it.
 */
async function resubscribe(
  link: Link,
  id: string,
  lastSeq: number,
  options: RunOptions,
): Promise<{ subscription: string; terminal?: undefined } | { terminal: Terminal }> {
  for (;;) {
    link.resubscribe = false;
    const fromSeq = lastSeq + 1;
    let sub: ExecSubscribeResult | undefined;
    try {
      sub = await link.call("exec.subscribe", { execution_id: id, from_seq: fromSeq }, true);
    } catch (e) {
      if (!(e instanceof CustosError) || e.code !== "exec.not_found") throw e;
    }
    if (link.resubscribe) continue; // lost again meanwhile
    const record: ExecutionView = await link.call("exec.get", { execution_id: id });
    if (link.resubscribe) continue;
    const replayFrom = sub?.replay_from;
    const gap = typeof replayFrom === "number" && replayFrom > fromSeq;
    if (options.onReconnect !== undefined) {
      options.onReconnect({ executionId: id, fromSeq, replayFrom, gap });
    } else if (gap) {
      process.emitWarning(
        `reconnected; events ${fromSeq}..${(replayFrom as number) - 1} of ${id} were not kept ` +
          "by the daemon (output is read back from the spool)",
        "ReconnectGapWarning",
      );
    }
    if (sub === undefined || typeof sub.subscription !== "string" || record.terminal != null) {
      return { terminal: await link.call("exec.wait", { execution_id: id }) };
    }
    return { subscription: sub.subscription };
  }
}

/** Delivers each stream's bytes in order, once, filling gaps from the spool. */
class OutputSink {
  private readonly written = new Map<string, number>();

  constructor(
    private readonly host: Link,
    private readonly id: string,
    private readonly onOutput: RunOptions["onOutput"],
  ) {}

  async onEvent(ev: ExecEvent): Promise<void> {
    const stream = ev.stream as Stream;
    const data = Buffer.from(ev.data_b64 ?? "", "base64");
    const done = this.done(stream);
    const offset = typeof ev.offset === "number" ? ev.offset : done;
    // Bytes before this chunk that no event brought (dropped for a slow reader, or evicted
    // before the start was answered).
    if (offset > done) await this.fill(stream, offset);
    const now = this.done(stream);
    if (offset + data.length <= now) return; // already delivered
    this.deliver(stream, data.subarray(now > offset ? now - offset : 0));
    this.written.set(stream, offset + data.length);
  }

  /**
   * After the terminal event: the bytes its events did not carry (dropped, beyond the plan's
   * event budget, evicted) are read from the spool. A stream delivered up to its observed count
   * (the terminal record's accounting) needs no call, so an ordinary run costs one request.
   */
  async drain(terminal: Terminal, streams: Stream[]): Promise<void> {
    for (const stream of streams) {
      const observed = terminal.output?.[stream]?.observed;
      if (typeof observed === "number" && this.done(stream) >= observed) continue;
      await this.fill(stream, undefined);
    }
  }

  // Reads the stream from what was delivered up to `upto` (or to the spool's end). Stops where
  // the spool has nothing more (it keeps at most the plan's spool_bytes), as `custos run` does.
  private async fill(stream: Stream, upto: number | undefined): Promise<void> {
    let done = this.done(stream);
    while (upto === undefined || done < upto) {
      const want = upto === undefined ? OUTPUT_SLICE : Math.min(OUTPUT_SLICE, upto - done);
      let r: ExecOutputResult;
      try {
        r = await this.host.call("exec.output", {
          execution_id: this.id,
          stream,
          offset: done,
          max_bytes: want,
        });
      } catch (e) {
        if (connectionLost(e)) throw e; // the reconnect budget ran out
        return;
      }
      const data = Buffer.from(r.data_b64, "base64");
      if (data.length === 0) return;
      this.deliver(stream, data);
      done += data.length;
      this.written.set(stream, done);
    }
  }

  private done(stream: string): number {
    return this.written.get(stream) ?? 0;
  }

  private deliver(stream: Stream, data: Buffer): void {
    if (data.length > 0) this.onOutput?.(stream, data);
  }
}

// Offers `data` in chunks the daemon accepts (it may take fewer bytes than offered: the rest is
// offered again), then EOF. Stops at the first refusal (the program closed its stdin, or the
// input limit) or when the run is over.
async function feedInput(
  host: RunHost,
  id: string,
  data: Buffer,
  over: () => boolean,
): Promise<void> {
  let off = 0;
  while (off < data.length && !over()) {
    const chunk = data.subarray(off, off + INPUT_CHUNK);
    const r = await host.call("exec.input", {
      execution_id: id,
      data_b64: chunk.toString("base64"),
    });
    off += r.accepted_bytes;
    if (r.accepted_bytes < chunk.length) await new Promise((res) => setTimeout(res, 10));
  }
  if (!over()) await host.call("exec.input", { execution_id: id, eof: true });
}
