// A client of livenessd, the Linux exit-notification daemon: tell it which process owns
// which session (`Client.register`), learn when it dies (`subscribe`, `waitForEnd`), have
// commands run at its end (`Registration.onEndRun`, `waitForFinalized`), hold locks
// released when their session ends (`Client.acquireLock`), and read or judge a process's
// fingerprint without a daemon (`capture`, `check`). The protocol is docs/protocol.md;
// Node's standard library is all it needs.

export * from "./client.js";
export * from "./errors.js";
export { capture, check, type Liveness } from "./proc.js";
export * from "./subscription.js";
export {
  DEFAULT_GRACE_MS,
  LOCK_ACQUIRED,
  LOCK_RELEASED,
  SESSION_ACTION,
  SESSION_ENDED,
  SESSION_FINALIZED,
  SESSION_OWNER_CHANGED,
  SESSION_REAPED,
  SESSION_REGISTERED,
  SESSION_RENAMED,
  isFinalized,
  sameProcess,
  succeeded,
  type ActionOutcome,
  type ActionSpec,
  type ActionState,
  type Cause,
  type ExitStatus,
  type Identity,
  type LivenessEvent,
  type Lock,
  type LockChange,
  type MembersUsage,
  type Message,
  type OnEnd,
  type Until,
  type Phase,
  type Process,
  type Reaped,
  type Sender,
  type Session,
  type Subscribed,
  type Survivors,
  type Usage,
} from "./types.js";
