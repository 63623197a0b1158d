//! The end of an action's stderr, in bounded memory whatever the action writes.

use std::collections::VecDeque;

/// The last `capacity` bytes written, and how many were written in all.
#[derive(Debug)]
pub struct Tail {
    bytes: VecDeque<u8>,
    capacity: usize,
    total: u64,
}

impl Tail {
    pub fn new(capacity: usize) -> Tail {
        Tail {
            bytes: VecDeque::with_capacity(capacity),
            capacity,
            total: 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let keep = &chunk[chunk.len().saturating_sub(self.capacity)..];
        let excess = (self.bytes.len() + keep.len()).saturating_sub(self.capacity);
        self.bytes.drain(..excess);
        self.bytes.extend(keep);
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept bytes as text: invalid UTF-8 replaced, and a character cut in two by the
    /// start of the window left out rather than shown as a replacement.
    pub fn text(&self) -> String {
        let (front, back) = self.bytes.as_slices();
        let mut bytes = [front, back].concat();
        if self.total > bytes.len() as u64 {
            let cut = bytes
                .iter()
                .take(3)
                .take_while(|&&b| b & 0xc0 == 0x80)
                .count();
            bytes.drain(..cut);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes_and_counts_them_all() {
        let mut tail = Tail::new(8);
        tail.push(b"abc");
        assert_eq!(tail.text(), "abc");
        tail.push(b"defghij");
        assert_eq!(tail.text(), "cdefghij");
        tail.push(&[b'x'; 100]);
        assert_eq!(tail.text(), "x".repeat(8));
        assert_eq!(tail.total(), 110);
    }

    #[test]
    fn a_character_cut_by_the_window_is_left_out() {
        let mut tail = Tail::new(4);
        tail.push("aé€".as_bytes()); // 1 + 2 + 3 bytes: the window starts inside "é"
        assert_eq!(tail.text(), "€");
        let mut whole = Tail::new(4);
        whole.push(&[0x80, b'a']);
        assert_eq!(
            whole.text(),
            "\u{fffd}a",
            "nothing was cut: shown as written"
        );
    }
}
