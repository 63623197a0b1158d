//! `docs/protocol.md` is the contract, and its JSON examples are its fixtures: every
//! ```` ```json ```` block carries a marker naming what it holds, and each is parsed here into
//! the real types and written back, so an example that the daemon would not send or accept
//! fails the build. The Go, TypeScript and Python clients decode the same blocks in their
//! own tests (`clients/*`), read from this file, never copied.
//!
//! The marker is an HTML comment on the line before the fence:
//!
//! - `<!-- contract: KIND -->`: the block is one JSON document of KIND;
//! - `<!-- contract: KIND lines -->`: every non-empty line of the block is one.
//!
//! KIND is `identity`, `exit_status`, `cause`, `usage`, `session`, `event`, `lock`, `survivors`, `doctor` (the
//! output of `liveness doctor --json`), or `wire`: a line of the protocol, told apart by its
//! keys as a client does (`op`: a request; `ok`: a reply; otherwise a stream message).
//! `<!-- contract: error_codes -->` marks the table of error codes.

use std::collections::BTreeSet;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use liveness_common::cause::{Cause, Usage};
use liveness_common::exit::ExitStatus;
use liveness_common::identity::Identity;
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorCode, Reply, StreamMessage, parse_request};
use liveness_common::session::{Event, Session, Survivors};
use liveness_common::status::{MembershipStatus, SourceReport};

const DOC: &str = include_str!("../../docs/protocol.md");
const MARKER: &str = "<!-- contract: ";

/// One fenced block of the document.
struct Block {
    /// 1-based line of its opening fence.
    line: usize,
    /// The fence's info string (`json`, `sh`, empty).
    language: String,
    /// The marker on the line before it, without `<!-- contract: ` and ` -->`.
    marker: Option<String>,
    text: String,
}

fn blocks() -> Vec<Block> {
    let lines: Vec<&str> = DOC.lines().collect();
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let Some(language) = lines[at].strip_prefix("```") else {
            at += 1;
            continue;
        };
        let end = (at + 1..lines.len())
            .find(|&i| lines[i].starts_with("```"))
            .unwrap_or_else(|| panic!("the fence of line {} is never closed", at + 1));
        let marker = at
            .checked_sub(1)
            .and_then(|before| lines[before].strip_prefix(MARKER))
            .and_then(|rest| rest.strip_suffix(" -->"))
            .map(str::to_owned);
        blocks.push(Block {
            line: at + 1,
            language: language.trim().to_owned(),
            marker,
            text: lines[at + 1..end].join("\n"),
        });
        at = end + 1;
    }
    blocks
}

/// The value that the absence of `key` means, for keys a writer may leave out (each is
/// documented so in docs/protocol.md). `null` is the absence of every optional key.
fn default_of(key: &str) -> Option<Value> {
    Some(match key {
        "comm" => json!(""),
        "on_end" => json!("leave"),
        "grace_ms" => json!(10_000),
        "labels" => json!({}),
        "pending" | "terminate" | "wait" => json!(false),
        "waiters" => json!(0),
        "warnings" | "wrappers" => json!([]),
        _ => return None,
    })
}

fn is_default(key: &str, value: &Value) -> bool {
    value.is_null() || default_of(key).as_ref() == Some(value)
}

/// `written` (the document's) and `again` (parsed and written back) say the same: equal,
/// but for keys present on one side only with their default value.
fn same(written: &Value, again: &Value, path: &str) -> Result<(), String> {
    match (written, again) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let at = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => same(x, y, &at)?,
                    (Some(only), None) | (None, Some(only)) if is_default(key, only) => {}
                    (Some(x), None) => return Err(format!("{at} ({x}) is lost when read")),
                    (None, Some(y)) => return Err(format!("{at} ({y}) appears when written")),
                    (None, None) => unreachable!("a key of one of the two"),
                }
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .try_for_each(|(i, (x, y))| same(x, y, &format!("{path}[{i}]"))),
        _ if written == again => Ok(()),
        _ => Err(format!(
            "{path} is {written} in the document, {again} read back"
        )),
    }
}

/// Parses `value` as a `T` and checks that writing it back says the same.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let again = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    same(value, &again, "")
}

/// A line of the protocol: a request, a reply or a stream message, by its keys.
fn check_wire(value: &Value) -> Result<(), String> {
    if value.get("op").is_some() {
        let envelope = parse_request(value.to_string().as_bytes())
            .map_err(|rejected| format!("the daemon refuses it: {}", rejected.error.message))?;
        let mut again = serde_json::to_value(&envelope.request).map_err(|e| e.to_string())?;
        for key in ["id", "v"] {
            if let Some(kept) = value.get(key) {
                again[key] = kept.clone();
            }
        }
        same(value, &again, "")
    } else if value.get("ok").is_some() {
        round_trip::<Reply>(value)
    } else {
        round_trip::<StreamMessage>(value)
    }
}

/// `liveness doctor --json`: the CLI's own keys around the daemon's types.
fn check_doctor(value: &Value) -> Result<(), String> {
    for (part, keys) in [
        ("daemon", &["pid", "version", "selection"][..]),
        ("client", &["pid", "euid", "kernel", "seccomp_mode"][..]),
    ] {
        for key in keys {
            if value[part].get(key).is_none() {
                return Err(format!("{part}.{key} is missing"));
            }
        }
        round_trip::<Vec<SourceReport>>(&value[part]["sources"])?;
    }
    round_trip::<MembershipStatus>(&value["daemon"]["membership"])
}

fn check(kind: &str, value: &Value) -> Result<(), String> {
    match kind {
        "identity" => round_trip::<Identity>(value),
        "exit_status" => round_trip::<ExitStatus>(value),
        "cause" => round_trip::<Cause>(value),
        "usage" => round_trip::<Usage>(value),
        "session" => round_trip::<Session>(value),
        "event" => round_trip::<Event>(value),
        "lock" => round_trip::<Lock>(value),
        "survivors" => round_trip::<Survivors>(value),
        "wire" => check_wire(value),
        "doctor" => check_doctor(value),
        other => Err(format!("unknown contract kind {other:?}")),
    }
}

/// The documents of a marked block: the whole text, or one per non-empty line.
fn documents(block: &Block, lines: bool) -> Vec<(usize, &str)> {
    if lines {
        block
            .text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| (block.line + 1 + i, line))
            .collect()
    } else {
        vec![(block.line + 1, block.text.as_str())]
    }
}

#[test]
fn every_json_block_is_marked_and_means_what_it_says() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for block in blocks().iter().filter(|b| b.language == "json") {
        let Some(marker) = &block.marker else {
            failures.push(format!(
                "line {}: a json block without a `{MARKER}KIND -->` line before it",
                block.line
            ));
            continue;
        };
        let (kind, lines) = match marker.strip_suffix(" lines") {
            Some(kind) => (kind, true),
            None => (marker.as_str(), false),
        };
        for (line, text) in documents(block, lines) {
            checked += 1;
            let result = serde_json::from_str::<Value>(text)
                .map_err(|e| format!("not JSON: {e}"))
                .and_then(|value| check(kind, &value));
            if let Err(e) = result {
                failures.push(format!("line {line} ({kind}): {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "docs/protocol.md:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 40, "only {checked} examples were found");
}

/// An example in a fence without `json` would escape the test above.
#[test]
fn json_examples_are_in_json_blocks() {
    for block in blocks().iter().filter(|b| b.language.is_empty()) {
        let json_like = block.text.lines().any(|line| {
            let line = line.trim_start_matches(['<', '>', ' ']);
            line.starts_with("{\"") || line.starts_with('[')
        });
        assert!(
            !json_like,
            "docs/protocol.md line {}: JSON in a block that is not ```json with a contract marker",
            block.line
        );
    }
}

/// Every error code, in the order of its declaration. `wire_name` fails to compile when a
/// code is added: add it here too.
const CODES: [ErrorCode; 18] = [
    ErrorCode::InvalidJson,
    ErrorCode::InvalidRequest,
    ErrorCode::LineTooLong,
    ErrorCode::UnsupportedVersion,
    ErrorCode::NotFound,
    ErrorCode::Forbidden,
    ErrorCode::Ambiguous,
    ErrorCode::AlreadyEnded,
    ErrorCode::AlreadyExists,
    ErrorCode::NotPending,
    ErrorCode::NoOwner,
    ErrorCode::InvalidOwner,
    ErrorCode::ShuttingDown,
    ErrorCode::TooManyConnections,
    ErrorCode::LimitReached,
    ErrorCode::LockHeld,
    ErrorCode::NotHeld,
    ErrorCode::Internal,
];

fn wire_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidJson => "invalid_json",
        ErrorCode::InvalidRequest => "invalid_request",
        ErrorCode::LineTooLong => "line_too_long",
        ErrorCode::UnsupportedVersion => "unsupported_version",
        ErrorCode::NotFound => "not_found",
        ErrorCode::Forbidden => "forbidden",
        ErrorCode::Ambiguous => "ambiguous",
        ErrorCode::AlreadyEnded => "already_ended",
        ErrorCode::AlreadyExists => "already_exists",
        ErrorCode::NotPending => "not_pending",
        ErrorCode::NoOwner => "no_owner",
        ErrorCode::InvalidOwner => "invalid_owner",
        ErrorCode::ShuttingDown => "shutting_down",
        ErrorCode::TooManyConnections => "too_many_connections",
        ErrorCode::LimitReached => "limit_reached",
        ErrorCode::LockHeld => "lock_held",
        ErrorCode::NotHeld => "not_held",
        ErrorCode::Internal => "internal",
    }
}

/// The codes of the table marked `error_codes`: the first cell of each row.
fn documented_codes() -> Vec<String> {
    let marker = format!("{MARKER}error_codes -->");
    DOC.lines()
        .skip_while(|line| *line != marker)
        .skip(1)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|row| {
            row.split('|')
                .nth(1)?
                .trim()
                .strip_prefix('`')?
                .strip_suffix('`')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_error_code_is_documented_once() {
    for code in CODES {
        assert_eq!(serde_json::to_value(code).unwrap(), json!(wire_name(code)));
    }
    let names: Vec<&str> = CODES.into_iter().map(wire_name).collect();
    assert_eq!(
        documented_codes(),
        names,
        "the table of error codes lists every code once, in the order of ErrorCode"
    );
}
