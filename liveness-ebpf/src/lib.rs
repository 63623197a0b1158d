//! Everything the daemon knows of its eBPF programs, in one place.
//!
//! - `bpf/`: the programs, in C with CO-RE, one file per kernel hook (`process_fork.c`,
//!   `process_exit.c`, `signal_generate.c`, `mark_victim.c`, `cgroup_attach.c`) over the maps and helpers they
//!   share (`maps.h`), compiled as one translation unit (`liveness.bpf.c`) into one object.
//!   `cargo xtask build-ebpf` rebuilds it; `--check` proves the committed one fresh.
//! - [`OBJECT`]: that object's bytes, embedded once for the daemon and the benchmarks.
//! - [`record`]: the Rust mirror of the ring-buffer record and of the maps' names and
//!   values (`bpf/liveness.h` is the C side), pinned by layout tests against the object's
//!   BTF.
//! - [`facts`]: how a record is read into the wire's `Cause` and `Usage`.
//!
//! Adding an exit cause touches this crate and the wire vocabulary only; the checklist is
//! in `docs/architecture.md`.

pub mod facts;
pub mod record;

pub use facts::KernelFacts;

/// The bytes of an object, aligned for the ELF parser (as `aya::include_bytes_aligned!`).
#[repr(C, align(32))]
struct Aligned<Bytes: ?Sized>(Bytes);

static ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!("../liveness.bpf.o"));

/// The compiled eBPF object (`liveness.bpf.o`), CO-RE relocated by the loader at load time.
pub static OBJECT: &[u8] = &ALIGNED.0;

#[cfg(test)]
mod tests {
    use std::ffi::CStr;
    use std::mem::{offset_of, size_of};

    use object::{Object, ObjectSection};

    use super::OBJECT;
    use crate::record::{ExitRecord, SignalCause, TreeUsage};

    /// Size and `(name, byte offset)` members of the struct `name` in raw BTF.
    fn btf_struct(btf: &[u8], name: &str) -> Option<(usize, Vec<(String, usize)>)> {
        let word = |at: usize| u32::from_ne_bytes(btf[at..at + 4].try_into().unwrap());
        assert_eq!(u16::from_ne_bytes([btf[0], btf[1]]), 0xeb9f, "BTF magic");
        let header_len = word(4) as usize;
        let types_at = header_len + word(8) as usize;
        let types_end = types_at + word(12) as usize;
        let strings_at = header_len + word(16) as usize;
        let string = |offset: u32| {
            CStr::from_bytes_until_nul(&btf[strings_at + offset as usize..])
                .unwrap()
                .to_str()
                .unwrap()
        };
        let mut at = types_at;
        while at < types_end {
            let info = word(at + 4);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            // Bytes that follow the 12-byte common header, by kind (linux/btf.h).
            let trailing = match kind {
                1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
                3 => 12,                      // ARRAY
                4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
                6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
                _ => 0,
            };
            if kind == 4 && string(word(at)) == name {
                assert_eq!(info >> 31, 0, "{name} has bitfields");
                let members = (0..vlen)
                    .map(|i| {
                        let member = at + 12 + 12 * i;
                        let bits = word(member + 8) as usize;
                        assert_eq!(bits % 8, 0, "{name} member {i} is not byte-aligned");
                        (string(word(member)).to_owned(), bits / 8)
                    })
                    .collect();
                return Some((word(at + 8) as usize, members));
            }
            at += 12 + trailing;
        }
        None
    }

    /// The C structs, as compiled into the committed object, have the Rust layouts.
    #[test]
    fn embedded_exit_record_matches_the_rust_layout() {
        let elf = object::File::parse(OBJECT).expect("the embedded eBPF object is not ELF");
        let btf = elf
            .section_by_name(".BTF")
            .expect("the embedded eBPF object has no .BTF section (built without -g?)")
            .data()
            .unwrap();
        let check = |name: &str, size: usize, expected: &[(&str, usize)]| {
            let (c_size, members) = btf_struct(btf, name).unwrap_or_else(|| {
                panic!("no struct {name} in the object's BTF: is fill_record still noinline?")
            });
            let expected: Vec<(String, usize)> = expected
                .iter()
                .map(|&(member, offset)| (member.to_owned(), offset))
                .collect();
            assert_eq!(members, expected, "struct {name} members (C vs Rust)");
            assert_eq!(c_size, size, "struct {name} size (C vs Rust)");
        };
        check(
            "exit_record",
            size_of::<ExitRecord>(),
            &[
                ("start_ticks", offset_of!(ExitRecord, start_ticks)),
                (
                    "exit_monotonic_ns",
                    offset_of!(ExitRecord, exit_monotonic_ns),
                ),
                ("tgid", offset_of!(ExitRecord, tgid)),
                ("wait_status", offset_of!(ExitRecord, wait_status)),
                ("usage", offset_of!(ExitRecord, usage)),
                ("members", offset_of!(ExitRecord, members)),
                ("cause", offset_of!(ExitRecord, cause)),
                ("flags", offset_of!(ExitRecord, flags)),
                ("pad", offset_of!(ExitRecord, pad)),
            ],
        );
        use crate::record::Usage as RawUsage;
        check(
            "usage",
            size_of::<RawUsage>(),
            &[
                ("user_ns", offset_of!(RawUsage, user_ns)),
                ("system_ns", offset_of!(RawUsage, system_ns)),
                ("runtime_ns", offset_of!(RawUsage, runtime_ns)),
                ("peak_rss_pages", offset_of!(RawUsage, peak_rss_pages)),
            ],
        );
        check(
            "tree_usage",
            size_of::<TreeUsage>(),
            &[
                ("root_start_ticks", offset_of!(TreeUsage, root_start_ticks)),
                ("total", offset_of!(TreeUsage, total)),
                ("exited", offset_of!(TreeUsage, exited)),
                ("pad", offset_of!(TreeUsage, pad)),
            ],
        );
        check(
            "signal_cause",
            size_of::<SignalCause>(),
            &[
                (
                    "target_start_ticks",
                    offset_of!(SignalCause, target_start_ticks),
                ),
                (
                    "sender_start_ticks",
                    offset_of!(SignalCause, sender_start_ticks),
                ),
                (
                    "sender_root_start_ticks",
                    offset_of!(SignalCause, sender_root_start_ticks),
                ),
                ("oom_cgroup_id", offset_of!(SignalCause, oom_cgroup_id)),
                ("sender_tgid", offset_of!(SignalCause, sender_tgid)),
                ("sender_uid", offset_of!(SignalCause, sender_uid)),
                (
                    "sender_root_tgid",
                    offset_of!(SignalCause, sender_root_tgid),
                ),
                ("code", offset_of!(SignalCause, code)),
                ("signal", offset_of!(SignalCause, signal)),
                ("origin", offset_of!(SignalCause, origin)),
                ("flags", offset_of!(SignalCause, flags)),
                ("sender_comm", offset_of!(SignalCause, sender_comm)),
            ],
        );
        use crate::record::MoveRecord;
        check(
            "move_record",
            size_of::<MoveRecord>(),
            &[
                ("start_ticks", offset_of!(MoveRecord, start_ticks)),
                ("root_start_ticks", offset_of!(MoveRecord, root_start_ticks)),
                ("cgroup_id", offset_of!(MoveRecord, cgroup_id)),
                ("tgid", offset_of!(MoveRecord, tgid)),
                ("root_tgid", offset_of!(MoveRecord, root_tgid)),
            ],
        );
    }
}
