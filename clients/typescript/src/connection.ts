// One Unix-socket connection to the daemon, read as lines.

import * as net from "node:net";

import { ConnectError, ConnectionLost } from "./errors.js";

/** Lines read ahead of the reader before the socket stops reading: a reader that falls
 * behind leaves the rest in the kernel, where the daemon sees it (and drops a lagging
 * subscriber with `lagged`), instead of in this process's memory. */
const READ_AHEAD = 64;

/** A connected socket whose input is read one line at a time, however long. */
export class LineSocket {
  private buffered = "";
  private lines: string[] = [];
  private waiting: { resolve: (line: string) => void; reject: (e: Error) => void } | undefined;
  private ended: Error | undefined;

  private constructor(private readonly socket: net.Socket) {
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      this.buffered += chunk;
      let newline: number;
      while ((newline = this.buffered.indexOf("\n")) >= 0) {
        this.lines.push(this.buffered.slice(0, newline));
        this.buffered = this.buffered.slice(newline + 1);
      }
      if (this.lines.length >= READ_AHEAD) socket.pause();
      this.deliver();
    });
    const end = (e?: Error) => {
      this.ended ??= new ConnectionLost(e ? `lost the connection to livenessd: ${e.message}` : "livenessd closed the connection");
      this.deliver();
    };
    socket.on("error", end);
    socket.on("close", () => end());
  }

  /** Connects to the socket at `path`. */
  static connect(path: string): Promise<LineSocket> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path });
      socket.once("connect", () => {
        socket.removeAllListeners("error");
        resolve(new LineSocket(socket));
      });
      socket.once("error", (e) => reject(new ConnectError(path, e)));
    });
  }

  private deliver(): void {
    const waiter = this.waiting;
    if (!waiter) return;
    if (this.lines.length > 0) {
      this.waiting = undefined;
      waiter.resolve(this.lines.shift()!);
      if (this.lines.length < READ_AHEAD && this.socket.isPaused()) this.socket.resume();
    } else if (this.ended) {
      this.waiting = undefined;
      waiter.reject(this.ended);
    }
  }

  /** The next line, without its newline; ConnectionLost once the connection ends. */
  readLine(): Promise<string> {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.deliver();
    });
  }

  write(line: string): void {
    if (this.ended) throw this.ended;
    this.socket.write(line);
  }

  close(): void {
    this.ended ??= new ConnectionLost("the connection was closed");
    this.socket.destroy();
  }
}
