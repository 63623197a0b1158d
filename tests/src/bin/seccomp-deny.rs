//! `seccomp-deny --deny bpf,pidfd_open [--errno ENOSYS|EPERM] -- CMD ARGS...`: runs CMD
//! with the listed system calls failing, as a container's seccomp profile or systemd's
//! `SystemCallFilter=` would make them fail, so tests can force the daemon onto its
//! fallback exit sources on any kernel.
//!
//! It installs a classic-BPF seccomp filter (no libseccomp: it must link statically and
//! run in a bare initramfs), sets `PR_SET_NO_NEW_PRIVS` as an unprivileged filter requires,
//! and execs CMD, which inherits the filter along with all its children.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// x86-64's x32 ABI shares the architecture value and sets this bit in the number; without
/// a check, `bpf | X32_BIT` would pass a deny list.
const X32_BIT: u32 = 0x4000_0000;

/// `offsetof(struct seccomp_data, nr)` and `offsetof(struct seccomp_data, arch)`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

/// The syscalls this wrapper can deny by name: those the exit sources use.
const SYSCALLS: &[(&str, libc::c_long)] = &[
    ("bpf", libc::SYS_bpf),
    ("pidfd_open", libc::SYS_pidfd_open),
    ("pidfd_send_signal", libc::SYS_pidfd_send_signal),
    ("perf_event_open", libc::SYS_perf_event_open),
];

const USAGE: &str =
    "usage: seccomp-deny --deny SYSCALL[,SYSCALL...] [--errno ENOSYS|EPERM] -- CMD [ARGS...]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (numbers, errno, command) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("seccomp-deny: {message}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    if let Err(message) = install(&filter(&numbers, errno)) {
        eprintln!("seccomp-deny: {message}");
        return ExitCode::from(71);
    }
    let error = Command::new(&command[0]).args(&command[1..]).exec();
    eprintln!("seccomp-deny: cannot run {}: {error}", command[0]);
    ExitCode::from(127)
}

fn parse(args: &[String]) -> Result<(Vec<u32>, u16, &[String]), String> {
    let mut numbers = Vec::new();
    let mut errno = libc::ENOSYS as u16;
    let mut rest = args;
    loop {
        match rest {
            [flag, list, tail @ ..] if flag == "--deny" => {
                for name in list.split(',') {
                    let number = SYSCALLS
                        .iter()
                        .find(|(known, _)| *known == name)
                        .map(|&(_, number)| number as u32)
                        .ok_or_else(|| {
                            let known: Vec<&str> = SYSCALLS.iter().map(|(n, _)| *n).collect();
                            format!("unknown syscall {name:?}; known: {}", known.join(", "))
                        })?;
                    numbers.push(number);
                }
                rest = tail;
            }
            [flag, name, tail @ ..] if flag == "--errno" => {
                errno = match name.as_str() {
                    "ENOSYS" => libc::ENOSYS as u16,
                    "EPERM" => libc::EPERM as u16,
                    other => return Err(format!("--errno {other:?}: expected ENOSYS or EPERM")),
                };
                rest = tail;
            }
            [separator, command @ ..] if separator == "--" && !command.is_empty() => {
                if numbers.is_empty() {
                    return Err("nothing to deny: give --deny".into());
                }
                return Ok((numbers, errno, command));
            }
            _ => return Err("expected --deny, --errno, or -- followed by a command".into()),
        }
    }
}

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump_if_equal(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// Wrong architecture: kill; x32 numbers: fail; a listed number: fail; the rest: allow.
fn filter(numbers: &[u32], errno: u16) -> Vec<libc::sock_filter> {
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let deny = libc::SECCOMP_RET_ERRNO | u32::from(errno);
    let mut program = vec![
        statement(load, OFFSET_ARCH),
        jump_if_equal(AUDIT_ARCH, 1, 0),
        statement(ret, libc::SECCOMP_RET_KILL_PROCESS),
        statement(load, OFFSET_NR),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            // Onwards to the deny at the end, past the checks below and the allow.
            jt: u8::try_from(numbers.len() + 1).expect("a short deny list"),
            jf: 0,
            k: X32_BIT,
        },
    ];
    for (at, &number) in numbers.iter().enumerate() {
        // Past the remaining checks and the allow, to the deny.
        let to_deny = u8::try_from(numbers.len() - at).expect("a short deny list");
        program.push(jump_if_equal(number, to_deny, 0));
    }
    program.push(statement(ret, libc::SECCOMP_RET_ALLOW));
    program.push(statement(ret, deny));
    program
}

fn install(program: &[libc::sock_filter]) -> Result<(), String> {
    let last_error = || std::io::Error::last_os_error();
    // SAFETY: plain integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("prctl(PR_SET_NO_NEW_PRIVS): {}", last_error()));
    }
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| "filter too long".to_owned())?,
        // The kernel copies the program and never writes through this pointer.
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, alive for the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &raw const fprog,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(format!(
            "prctl(PR_SET_SECCOMP): {} (a kernel without CONFIG_SECCOMP_FILTER?)",
            last_error()
        ));
    }
    Ok(())
}
