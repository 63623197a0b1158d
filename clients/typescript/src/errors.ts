// Errors: the daemon's refusals with their codes, and the client's own.

import type { ErrorCode } from "./types.gen.js";

export { ERROR_CODES, type ErrorCode } from "./types.gen.js";

/** Every error of this package. */
export class LivenessError extends Error {
  override name = "LivenessError";
}

/** The daemon refused a request: `code` for programs, `message` for people.
 *
 * ```ts
 * try { await client.get("x"); } catch (e) { if (DaemonError.is(e, "not_found")) ... }
 * ```
 */
export class DaemonError extends LivenessError {
  override name = "DaemonError";
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }

  /** Whether `error` is a refusal with this code. */
  static is(error: unknown, code: ErrorCode): error is DaemonError {
    return error instanceof DaemonError && error.code === code;
  }
}

/** The daemon's socket could not be reached. */
export class ConnectError extends LivenessError {
  override name = "ConnectError";
  constructor(
    readonly socket: string,
    cause: Error,
  ) {
    super(`cannot connect to livenessd at ${socket}: ${cause.message} (is the daemon running? set LIVENESS_SOCKET)`);
  }
}

/** The daemon closed the connection, or it broke (the daemon may be restarting). */
export class ConnectionLost extends LivenessError {
  override name = "ConnectionLost";
}

/** The process named does not exist (in this PID namespace), or has exited. */
export class NoSuchProcess extends LivenessError {
  override name = "NoSuchProcess";
}

/** A subscription could not reach the daemon again within its retry bound. */
export class GaveUp extends LivenessError {
  override name = "GaveUp";
}

/** Whether a daemon that is restarting could explain `error`. */
export function transient(error: unknown): boolean {
  return (
    error instanceof ConnectError ||
    error instanceof ConnectionLost ||
    DaemonError.is(error, "shutting_down") ||
    DaemonError.is(error, "too_many_connections")
  );
}
