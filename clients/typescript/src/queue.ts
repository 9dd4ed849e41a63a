// An unbounded async FIFO: pushed by the socket's data handler, read with `for await`.
//
// The socket is always read (a paused socket would hold up every other call on the
// connection), so a slow consumer queues here; the daemon's own bound (event-queue-bytes,
// docs/api.md) applies only while this process does not read at all.
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private head = 0;
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void } | null =
    null;
  private ended = false;
  private failure: unknown = undefined;

  push(item: T): void {
    if (this.ended) return;
    if (this.waiter !== null) {
      const w = this.waiter;
      this.waiter = null;
      w.resolve({ value: item, done: false });
      return;
    }
    this.items.push(item);
  }

  /** No more items: readers get what is queued, then the end. */
  end(): void {
    this.ended = true;
    this.wake();
  }

  /** Readers get what is queued, then `error`. */
  fail(error: unknown): void {
    if (this.ended) return;
    this.failure = error;
    this.ended = true;
    this.wake();
  }

  next(): Promise<IteratorResult<T>> {
    if (this.head < this.items.length) {
      const value = this.items[this.head++] as T;
      if (this.head > 1024 && this.head * 2 > this.items.length) {
        this.items = this.items.slice(this.head);
        this.head = 0;
      }
      return Promise.resolve({ value, done: false });
    }
    if (this.ended) {
      if (this.failure !== undefined) return Promise.reject(this.failure);
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return { next: () => this.next() };
  }

  private wake(): void {
    if (this.waiter === null || this.head < this.items.length) return;
    const w = this.waiter;
    this.waiter = null;
    if (this.failure !== undefined) w.reject(this.failure);
    else w.resolve({ value: undefined, done: true });
  }
}
