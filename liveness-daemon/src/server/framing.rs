//! Lines on a connection: request lines read within bounds (their length, and the time a
//! begun line may take), each with the descriptors that came with it; reply and stream
//! lines written within a timeout.

use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::fair::closer::Closer;
use crate::fd::pass::{FdReader, Passed};
use liveness_common::protocol::MAX_LINE_BYTES;

/// A client that does not take a line within this long is disconnected.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A line buffer that grew beyond this for one long request is given back after it, so
/// that idle connections do not keep their high-water mark.
const KEPT_LINE_CAPACITY: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectionError {
    #[error("client write timed out")]
    WriteTimeout,
    #[error("client stalled in the middle of a request line")]
    LineTimeout,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What [`read_line_bounded`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A line (with its newline, unless the input ended without one) is in the buffer.
    Complete,
    /// A line of this many bytes exceeded the limit; it was consumed and dropped.
    TooLong(usize),
    /// The client closed its side.
    End,
}

/// The reading side of a connection: request lines, read with `recvmsg` so that a request
/// may come with a pidfd naming its owner.
#[derive(Debug)]
pub(super) struct Requests {
    reader: BufReader<FdReader>,
    /// The last line read.
    line: Vec<u8>,
    /// Stream position of the next line, to claim the descriptors sent with each line.
    position: u64,
}

impl Requests {
    pub(super) fn new(read: OwnedReadHalf, uid: u32, closer: Closer) -> Requests {
        Requests {
            reader: BufReader::new(FdReader::new(read, uid, closer)),
            line: Vec::new(),
            position: 0,
        }
    }

    /// Waits for a request line, with the descriptors sent with it ([`Requests::line`]
    /// holds it then). Waiting for one to begin costs nothing; once it has begun it must
    /// end within `timeout`, so that no client pins a half line's buffer for long. The
    /// descriptors are claimed even for a line that is refused, so that they are closed.
    pub(super) async fn next(
        &mut self,
        timeout: Duration,
    ) -> Result<(Line, Vec<Passed>), ConnectionError> {
        let read = read_request(&mut self.reader, &mut self.line, timeout).await?;
        let start = self.position;
        self.position += match read {
            Line::TooLong(length) => length as u64,
            _ => self.line.len() as u64,
        };
        let fds = self.reader.get_mut().take_fds(start..self.position);
        Ok((read, fds))
    }

    /// The line [`Requests::next`] read last.
    pub(super) fn line(&self) -> &[u8] {
        &self.line
    }

    /// Reads and drops a line of a client that is not to send any (a stream's).
    pub(super) async fn skip(&mut self) -> std::io::Result<Line> {
        read_line_bounded(&mut self.reader, &mut self.line, MAX_LINE_BYTES).await
    }

    /// See [`FdReader::read_only`]: for a connection that only writes from now on.
    pub(super) fn read_only(&mut self, write: OwnedWriteHalf) -> std::io::Result<OwnedFd> {
        self.reader.get_mut().read_only(write)
    }

    /// Resolves when the client closes its side, also after sending more (what it sent is
    /// read after the current reply, and a client that hangs up leaves it unread).
    pub(super) async fn closed(&self) {
        // A socket that fails is as good as closed.
        let _ = self.reader.get_ref().hung_up().await;
    }
}

/// Reads one line of at most `max` bytes into `line`, without ever buffering more.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    line.clear();
    let mut dropped = 0usize;
    loop {
        let available = reader.fill_buf().await?;
        let (chunk, complete) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (&available[..=end], true),
            None => (available, available.is_empty()),
        };
        let used = chunk.len();
        if dropped > 0 || line.len() + used > max {
            dropped += line.len() + used;
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        reader.consume(used);
        if complete {
            return Ok(match (dropped, line.is_empty()) {
                (0, true) => Line::End,
                (0, false) => Line::Complete,
                (length, _) => Line::TooLong(length),
            });
        }
    }
}

/// Waits for a request line (see [`Requests::next`]).
async fn read_request<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    timeout: Duration,
) -> Result<Line, ConnectionError> {
    if line.capacity() > KEPT_LINE_CAPACITY {
        *line = Vec::new();
    }
    if reader.fill_buf().await?.is_empty() {
        return Ok(Line::End);
    }
    tokio::time::timeout(timeout, read_line_bounded(reader, line, MAX_LINE_BYTES))
        .await
        .map_err(|_| ConnectionError::LineTimeout)?
        .map_err(ConnectionError::from)
}

/// Writes lines and flushes them, all within [`WRITE_TIMEOUT`].
pub(super) async fn write_lines<W: AsyncWrite + Unpin, S: AsRef<str>>(
    writer: &mut W,
    lines: &[S],
) -> Result<(), ConnectionError> {
    let write = async {
        for line in lines {
            writer.write_all(line.as_ref().as_bytes()).await?;
            writer.write_all(b"\n").await?;
        }
        writer.flush().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .map_err(|_| ConnectionError::WriteTimeout)??;
    Ok(())
}

pub(super) async fn write_json<W: AsyncWrite + Unpin>(
    writer: &mut W,
    value: &impl serde::Serialize,
) -> Result<(), ConnectionError> {
    let line = serde_json::to_string(value).map_err(std::io::Error::other)?;
    write_lines(writer, &[line]).await
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every read of `input` in 4-byte buffer fills: complete lines as text, or the outcome.
    async fn lines(input: &[u8], max: usize) -> Vec<Result<String, Line>> {
        lines_read_by(input, 4, max)
            .await
            .into_iter()
            .map(|read| read.map(|line| String::from_utf8(line).unwrap()))
            .collect()
    }

    /// Every read of `input` in `fill`-byte buffer fills: complete lines, or the outcome.
    async fn lines_read_by(input: &[u8], fill: usize, max: usize) -> Vec<Result<Vec<u8>, Line>> {
        let mut reader = BufReader::with_capacity(fill, input);
        let mut line = Vec::new();
        let mut out = Vec::new();
        loop {
            let read = read_line_bounded(&mut reader, &mut line, max)
                .await
                .unwrap();
            assert!(
                line.len() <= max,
                "buffered {} bytes of at most {max}",
                line.len()
            );
            match read {
                Line::Complete => out.push(Ok(line.clone())),
                Line::End => {
                    out.push(Err(Line::End));
                    return out;
                }
                other => out.push(Err(other)),
            }
        }
    }

    #[tokio::test]
    async fn bounded_lines_skip_only_the_overlong_one() {
        let got = lines(b"ok\n0123456789abc\nnext\nlast", 8).await;
        assert_eq!(
            got,
            vec![
                Ok("ok\n".into()),
                Err(Line::TooLong(14)),
                Ok("next\n".into()),
                Ok("last".into()),
                Err(Line::End)
            ]
        );
        assert_eq!(
            lines(b"0123456789", 8).await,
            vec![Err(Line::TooLong(10)), Err(Line::End)]
        );
        assert_eq!(lines(b"", 8).await, vec![Err(Line::End)]);
    }

    proptest! {
        /// However the input is cut into reads, each line is returned whole when it fits,
        /// reported with its length when it does not, and never buffered beyond the limit.
        #[test]
        fn lines_are_read_whole_or_skipped_whatever_the_reads(
            // Only newlines matter to the reader: runs of one other byte, each perhaps
            // ended by a newline, make every shape of input cheaply.
            runs in prop::collection::vec((0..160usize, any::<u8>(), any::<bool>()), 0..12),
            fill in 1..64usize,
            max in 1..96usize,
        ) {
            let input: Vec<u8> = runs
                .into_iter()
                .flat_map(|(length, byte, newline)| {
                    let byte = if byte == b'\n' { b'x' } else { byte };
                    std::iter::repeat_n(byte, length).chain(newline.then_some(b'\n'))
                })
                .collect();
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let got = runtime.block_on(lines_read_by(&input, fill, max));
            let expected: Vec<Result<Vec<u8>, Line>> = input
                .split_inclusive(|&b| b == b'\n')
                .map(|line| match line.len() {
                    length if length <= max => Ok(line.to_vec()),
                    length => Err(Line::TooLong(length)),
                })
                .chain([Err(Line::End)])
                .collect();
            prop_assert_eq!(got, expected);
        }
    }
}
