//! A whole eBPF hash map read in a few system calls (`BPF_MAP_LOOKUP_BATCH`, 5.6+), where
//! aya's iterator takes two per entry (`get_next_key`, then `lookup`). The members map holds
//! an entry for every tracked owner, and the lineages map one for every process forked
//! since the programs were loaded: a registration reads the lineages whole, an ending the
//! members, so a walk one entry at a time cost each of them two calls per tracked owner or
//! per process of the machine.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use aya::Pod;
use aya::maps::{HashMap, IterableMap, MapData};

/// `BPF_MAP_LOOKUP_BATCH` of `enum bpf_cmd`.
const LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for in one call at first, doubled with each call up to [`MAX_ROOM`]: most
/// walks are of a few entries. A hash map hands out whole buckets, and says `ENOSPC` when
/// the next one does not fit at all, so the room doubles then too.
const FIRST_ROOM: usize = 256;
const MAX_ROOM: usize = 16_384;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of `map`. Entries added or deleted meanwhile may be in it or not, as with any
/// walk. Should the kernel refuse batches (an LSM, say), the map is walked an entry at a
/// time, and the refusal logged.
pub fn entries<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>) -> Vec<(K, V)> {
    match batches(map) {
        Ok(entries) => entries,
        Err(error) => {
            tracing::warn!(%error, "cannot read an eBPF map in batches; walking it an entry at a time");
            map.iter().filter_map(Result::ok).collect()
        }
    }
}

fn batches<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>) -> io::Result<Vec<(K, V)>> {
    let fd = map.map().fd().as_fd().as_raw_fd();
    let mut room = FIRST_ROOM;
    let mut entries = Vec::new();
    // The hash map's position is a bucket index (a u32); the room of a u64 is to spare.
    let (mut position, mut next) = (0u64, 0u64);
    let mut started = false;
    let (mut keys, mut values): (Vec<K>, Vec<V>) = (Vec::new(), Vec::new());
    loop {
        keys.clear();
        values.clear();
        keys.reserve(room);
        values.reserve(room);
        let mut attr = BatchAttr {
            in_batch: if started {
                &raw const position as u64
            } else {
                0
            },
            out_batch: &raw mut next as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: room as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr` prefix for this command; the kernel writes at
        // most `count` keys and values of the map's sizes, which aya checked are `K`'s and
        // `V`'s when `map` was made, into buffers of `room` of each, and the position into
        // `next`.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let error = (result < 0).then(io::Error::last_os_error);
        match error.as_ref().and_then(io::Error::raw_os_error) {
            Some(libc::ENOSPC) => {
                room *= 2;
                continue;
            }
            None | Some(libc::ENOENT) => {}
            Some(_) => return Err(error.expect("an error")),
        }
        let filled = (attr.count as usize).min(room);
        // SAFETY: the kernel wrote `filled` keys and values, within the capacity reserved,
        // and `Pod` types are valid for any bytes it wrote.
        unsafe {
            keys.set_len(filled);
            values.set_len(filled);
        }
        entries.extend(keys.iter().copied().zip(values.iter().copied()));
        // ENOENT: the last bucket has been read.
        if error.is_some() {
            return Ok(entries);
        }
        position = next;
        started = true;
        // A map larger than the room takes fewer calls the further the walk goes.
        room = (room * 2).min(MAX_ROOM);
    }
}
