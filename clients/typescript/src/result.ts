// Reading a terminal result the way `custos run` does (docs/cli.md, "Exit codes").
import type { Terminal } from "./types";

/** Success is derived, never stored: exited with code 0, no trigger, cleanup confirmed. */
export function succeeded(t: Terminal): boolean {
  return (
    t.classification === "exited" &&
    t.exit?.code === 0 &&
    t.trigger === null &&
    t.tree?.cleanup === "confirmed"
  );
}

/** The exit code `custos run` exits with for this result (124 timed_out, 125 cancelled, ...). */
export function exitCode(t: Terminal): number {
  switch (t.classification) {
    case "exited":
    case "signaled":
      if (typeof t.exit?.signal === "number") return 128 + t.exit.signal;
      if (typeof t.exit?.code === "number") return t.exit.code & 0xff;
      return 126;
    case "spawn_failed":
      return 127;
    case "cancelled":
      return 125;
    case "timed_out":
      return 124;
    default:
      return 126;
  }
}
