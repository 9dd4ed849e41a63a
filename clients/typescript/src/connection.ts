// One Unix-socket connection to the daemon: newline-framed JSON-RPC 2.0 (docs/api.md,
// "Transport"), any number of calls in flight matched by id, and exec.event notifications
// routed to their subscription.
import * as net from "node:net";

import { CustosError, isObject, unavailable } from "./errors";
import { AsyncQueue } from "./queue";
import type { ExecEvent } from "./types";

interface Pending {
  resolve: (result: unknown) => void;
  reject: (error: CustosError) => void;
}

const NEWLINE = 0x0a;

export class Connection {
  private readonly socket: net.Socket;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  // Events of subscriptions someone reads, and those of subscriptions not claimed yet: replayed
  // events may arrive before the exec.subscribe answer that names the subscription, and a
  // start's events are parsed from the same read as its answer, before the caller resumes.
  private readonly claimed = new Map<string, AsyncQueue<ExecEvent>>();
  private readonly unclaimed = new Map<string, ExecEvent[]>();
  // Subscriptions given up before their end: their events still in flight are dropped.
  private readonly released = new Set<string>();
  private chunks: Buffer[] = [];
  private closedWith: CustosError | null = null;

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (err: NodeJS.ErrnoException) =>
      this.shut(unavailable(`daemon connection lost: ${err.message}`, err)),
    );
    socket.on("close", () => this.shut(unavailable("the daemon closed the connection")));
  }

  /** Connects, or fails with `rpc.unavailable` (no daemon answers at `path`). */
  static open(path: string): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path });
      const onError = (err: NodeJS.ErrnoException) => {
        socket.destroy();
        reject(unavailable(`no custos daemon at ${path} (${err.message})`, err));
      };
      socket.once("error", onError);
      socket.once("connect", () => {
        socket.off("error", onError);
        resolve(new Connection(socket));
      });
    });
  }

  get closed(): boolean {
    return this.closedWith !== null;
  }

  /** Sends one request; resolves with its result, rejects with the error it carries. */
  request(method: string, params: unknown): Promise<unknown> {
    if (this.closedWith !== null) return Promise.reject(this.closedWith);
    const id = this.nextId++;
    const line = JSON.stringify({ jsonrpc: "2.0", id, method, params: params ?? {} }) + "\n";
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.socket.write(line);
      this.updateRef();
    });
  }

  /** The events of `subscription`, those that arrived before this call first. */
  claim(subscription: string): AsyncQueue<ExecEvent> {
    const queue = new AsyncQueue<ExecEvent>();
    if (this.closedWith !== null) {
      queue.fail(this.closedWith);
      return queue;
    }
    const held = this.unclaimed.get(subscription) ?? [];
    this.unclaimed.delete(subscription);
    for (const ev of held) queue.push(ev);
    // A subscription whose terminal event came before it was claimed is complete already.
    if (held.some((ev) => ev.kind === "terminal")) queue.end();
    else this.claimed.set(subscription, queue);
    this.updateRef();
    return queue;
  }

  /** Stops routing `subscription`'s events (after exec.unsubscribe, or when done reading). */
  release(subscription: string): void {
    this.released.add(subscription);
    this.claimed.get(subscription)?.end();
    this.claimed.delete(subscription);
    this.unclaimed.delete(subscription);
    this.updateRef();
  }

  close(): void {
    this.shut(unavailable("the client was closed"));
    this.socket.destroy();
  }

  private onData(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(NEWLINE, start);
      if (nl < 0) break;
      const part = chunk.subarray(start, nl);
      const line = this.chunks.length === 0 ? part : Buffer.concat([...this.chunks, part]);
      this.chunks = [];
      start = nl + 1;
      this.onLine(line);
      if (this.closedWith !== null) return;
    }
    if (start < chunk.length) this.chunks.push(chunk.subarray(start));
  }

  private onLine(raw: Buffer): void {
    const text = raw.toString("utf8").replace(/\r$/, "");
    if (text.trim() === "") return;
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      this.fatal(
        new CustosError("rpc.parse_error", "terminal", "the daemon sent a line that is not JSON"),
      );
      return;
    }
    if (!isObject(msg)) {
      this.fatal(
        new CustosError(
          "rpc.parse_error",
          "terminal",
          "the daemon sent something that is not a JSON object",
        ),
      );
      return;
    }
    if (typeof msg.method === "string") {
      if (msg.method === "exec.event" && isObject(msg.params))
        this.onEvent(msg.params as ExecEvent);
      return;
    }
    const id = msg.id;
    if (typeof id !== "number") {
      // An error without an id (line too long, parse error) ends the connection: every call in
      // flight learns why.
      if (isObject(msg.error)) this.fatal(CustosError.fromRpc(msg.error));
      return;
    }
    const p = this.pending.get(id);
    if (p === undefined) return;
    this.pending.delete(id);
    this.updateRef();
    if ("error" in msg) p.reject(CustosError.fromRpc(msg.error));
    else p.resolve(msg.result);
  }

  private onEvent(ev: ExecEvent): void {
    const sub = ev.subscription;
    if (typeof sub !== "string") return;
    const queue = this.claimed.get(sub);
    if (queue !== undefined) {
      queue.push(ev);
      if (ev.kind === "terminal") {
        queue.end();
        this.claimed.delete(sub);
        this.updateRef();
      }
      return;
    }
    if (this.released.has(sub)) {
      if (ev.kind === "terminal") this.released.delete(sub);
      return;
    }
    const held = this.unclaimed.get(sub);
    if (held !== undefined) held.push(ev);
    else this.unclaimed.set(sub, [ev]);
  }

  // The socket keeps the process alive only while something waits on it: a script that forgot
  // close() still exits once its calls are answered and its subscriptions ended.
  private updateRef(): void {
    if (this.pending.size > 0 || this.claimed.size > 0) this.socket.ref();
    else this.socket.unref();
  }

  private fatal(error: CustosError): void {
    this.shut(error);
    this.socket.destroy();
  }

  // Every call in flight and every subscription read fails with `error` (the first reason wins).
  private shut(error: CustosError): void {
    if (this.closedWith !== null) return;
    this.closedWith = error;
    for (const p of this.pending.values()) p.reject(error);
    this.pending.clear();
    for (const q of this.claimed.values()) q.fail(error);
    this.claimed.clear();
    this.unclaimed.clear();
  }
}
