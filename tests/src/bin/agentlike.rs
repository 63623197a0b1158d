//! An agent's process tree as the activity tests need it: `agentlike MODE [ADDR|DIR]`
//! sets itself up, prints `ready` and lives until killed. Modes:
//!
//! - `read ADDR`: connects to ADDR (TCP) and reads whatever arrives, blocked in `recv`
//!   between chunks: a streaming response.
//! - `unread ADDR`: connects to ADDR and never reads: bytes pile up in its receive queue.
//! - `mcp ADDR`: first forks a long-lived child that burns about 2 % of a core in short
//!   bursts with a little I/O (a server's timers and reconnects), then does as `read`.
//! - `spin`: a busy loop, no I/O.
//! - `write DIR`: writes a file in DIR every 200 ms.
//! - `tool`: forks a child that sleeps (a silent tool) and waits for it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn connect(addr: Option<&String>) -> TcpStream {
    let addr = addr.unwrap_or_else(|| usage());
    TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
}

fn read_forever(mut stream: TcpStream) -> ! {
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => std::thread::sleep(Duration::from_secs(3600)),
            Ok(_) => {}
        }
    }
}

/// Forks a child that runs `body` and never returns; the parent goes on.
fn fork_child(body: impl FnOnce()) {
    // SAFETY: this process is single-threaded here; the child runs `body`, which never
    // returns, then exits without unwinding.
    match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            body();
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        _ => {}
    }
}

fn usage() -> ! {
    eprintln!("usage: agentlike read|unread|mcp ADDR | spin | write DIR | tool");
    std::process::exit(100)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("read") => {
            let stream = connect(args.get(1));
            ready();
            read_forever(stream)
        }
        Some("unread") => {
            let _stream = connect(args.get(1));
            ready();
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Some("mcp") => {
            fork_child(|| {
                let mut sink = std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/null")
                    .expect("/dev/null");
                loop {
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_millis(20) {
                        std::hint::spin_loop();
                    }
                    let _ = sink.write_all(b"ping");
                    std::thread::sleep(Duration::from_millis(980));
                }
            });
            let stream = connect(args.get(1));
            ready();
            read_forever(stream)
        }
        Some("spin") => {
            ready();
            loop {
                std::hint::spin_loop();
            }
        }
        Some("write") => {
            let dir = args.get(1).unwrap_or_else(|| usage());
            ready();
            for n in 0u64.. {
                std::fs::write(format!("{dir}/out-{}", n % 8), vec![b'x'; 4096])
                    .expect("write a file");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Some("tool") => {
            fork_child(|| {
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            });
            ready();
            // SAFETY: waits for any child; nothing else runs.
            unsafe { libc::wait(std::ptr::null_mut()) };
        }
        _ => usage(),
    }
}
