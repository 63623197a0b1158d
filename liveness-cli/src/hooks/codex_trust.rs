//! Codex's trust of liveness's hooks. Codex (0.171.0) runs a hook that is not managed only
//! when the `config.toml` beside its `hooks.json` records, under `[hooks.state."FILE:EVENT:
//! GROUP:HANDLER"]` (`FILE` the hooks file's path, `EVENT` in snake case, the indexes from
//! 0), a `trusted_hash` equal to the hook's current hash: `sha256:` and the hex SHA-256 of
//! the hook's normalized form, compact JSON with sorted keys (`event_name`, the group's
//! `matcher` if any, and `hooks` holding the one handler with its `timeout` (600 when
//! unset) and `async` (false when unset)). That is what Codex's own `/hooks` trust writes;
//! checked against the real codex 0.171.0, whose hook trusted so ran while an untrusted one
//! beside it did not.
//!
//! `install` appends a block of liveness's own to `config.toml`, between two marker
//! comments, with one table per hook of liveness's that the rest of the file does not
//! name already; `uninstall` takes the block out again. The rest of the file is left as it
//! is, byte for byte.

use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::json::{Json, Object};

/// Codex's configuration file, beside its hooks file.
pub const CONFIG: &str = "config.toml";

const START: &str = "# Written by liveness (hooks install codex): Codex's trust of its hooks.";
const END: &str = "# End of liveness's trust.";

/// Codex's default hook timeout, in seconds, which the hash counts when a hook sets none.
const DEFAULT_TIMEOUT: u64 = 600;

/// One hook's trust: its key in `hooks.state`, and the hash Codex expects there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub hash: String,
}

/// The trust entries of the command hooks in `settings` (the hooks file at `path`) for
/// which `ours` holds.
pub fn entries(path: &Path, settings: &Object, ours: impl Fn(&str) -> bool) -> Vec<Entry> {
    let settings = Json::Object(settings.clone()).to_value();
    let Some(events) = settings["hooks"].as_object() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (event, groups) in events {
        let label = snake_case(event);
        for (g, group) in groups.as_array().into_iter().flatten().enumerate() {
            let matcher = group["matcher"].as_str();
            for (h, handler) in group["hooks"].as_array().into_iter().flatten().enumerate() {
                let Some(command) = handler["command"].as_str() else {
                    continue;
                };
                if handler["type"] == "command" && ours(command) {
                    found.push(Entry {
                        key: format!("{}:{label}:{g}:{h}", path.display()),
                        hash: hash(&label, matcher, handler, command),
                    });
                }
            }
        }
    }
    found
}

/// `SessionStart` as `session_start`.
fn snake_case(event: &str) -> String {
    let mut label = String::new();
    for (i, c) in event.char_indices() {
        if c.is_ascii_uppercase() && i > 0 {
            label.push('_');
        }
        label.push(c.to_ascii_lowercase());
    }
    label
}

/// The hash Codex computes for the handler `handler` of a group with `matcher`.
fn hash(label: &str, matcher: Option<&str>, handler: &Value, command: &str) -> String {
    let mut hook = json!({
        "type": "command",
        "command": command,
        "timeout": handler["timeout"].as_u64().unwrap_or(DEFAULT_TIMEOUT).max(1),
        "async": handler["async"].as_bool().unwrap_or(false),
    });
    if let Some(message) = handler["statusMessage"].as_str() {
        hook["statusMessage"] = json!(message);
    }
    let mut identity = json!({"event_name": label, "hooks": [hook]});
    if let Some(matcher) = matcher {
        identity["matcher"] = json!(matcher);
    }
    // serde_json's objects are sorted maps: this is the compact, key-sorted form.
    let digest = Sha256::digest(identity.to_string());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

/// `config` with liveness's trust block holding `entries`, less those whose key the rest of
/// the file names already (Codex's own record, left to Codex), in place of the block it had.
/// Refused when the file sets `hooks` inline, where no table can be added.
pub fn with_trust(config: &str, entries: &[Entry]) -> Result<String, String> {
    let rest = without_trust(config);
    if rest.lines().any(|line| {
        line.trim_start()
            .strip_prefix("hooks")
            .is_some_and(|after| after.trim_start().starts_with('='))
    }) {
        return Err(format!(
            "its {CONFIG} sets hooks inline (hooks = {{...}}), where liveness cannot add their trust"
        ));
    }
    let missing: Vec<&Entry> = entries
        .iter()
        .filter(|entry| !rest.contains(&toml_string(&entry.key)))
        .collect();
    if missing.is_empty() {
        return Ok(rest);
    }
    let mut block = format!("\n{START}\n");
    for entry in missing {
        block.push_str(&format!(
            "[hooks.state.{}]\ntrusted_hash = {}\n",
            toml_string(&entry.key),
            toml_string(&entry.hash)
        ));
    }
    block.push_str(END);
    block.push('\n');
    Ok(rest + &block)
}

/// `config` without liveness's trust block: as it was before `install` added it.
pub fn without_trust(config: &str) -> String {
    let start = format!("\n{START}\n");
    let end = format!("{END}\n");
    match config.find(&start) {
        Some(at) => match config[at..].find(&end) {
            Some(len) => format!("{}{}", &config[..at], &config[at + len + end.len()..]),
            None => config.to_owned(),
        },
        None => config.to_owned(),
    }
}

/// Whether `config` records each of `entries` as trusted, with the hash Codex computes now.
pub fn trusted(config: &str, entries: &[Entry]) -> bool {
    entries.iter().all(|entry| {
        config.contains(&toml_string(&entry.key)) && config.contains(&toml_string(&entry.hash))
    })
}

/// `text` as a TOML basic string: JSON's escapes are TOML's.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(command: &str) -> Object {
        let text = json!({"hooks": {
            "SessionStart": [{"hooks": [{"type": "command", "command": "true"}]},
                             {"hooks": [{"type": "command", "command": command}]}],
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "x", "timeout": 5}]}],
        }});
        match Json::from_value(&text) {
            Json::Object(object) => object,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_hash_is_the_one_codex_0_171_trusted() {
        // A hooks file run by the real codex 0.171.0: this hash in config.toml made it run
        // its SessionStart hook, which it skipped without.
        let command =
            "cat >> /tmp/runs_codex/home/start.log; echo >> /tmp/runs_codex/home/start.log";
        let found = entries(Path::new("/h/.codex/hooks.json"), &settings(command), |c| {
            c == command
        });
        assert_eq!(
            found,
            [Entry {
                key: "/h/.codex/hooks.json:session_start:1:0".into(),
                hash: "sha256:803e563183ced0833e16f0c5201c8ce65356b5e44059af115f936eb029456247"
                    .into(),
            }]
        );
        assert_eq!(snake_case("UserPromptSubmit"), "user_prompt_submit");
    }

    #[test]
    fn the_trust_block_is_added_once_and_taken_out_byte_for_byte() {
        let found = entries(Path::new("/h/a \"b\"/hooks.json"), &settings("ours"), |c| {
            c == "ours"
        });
        let config = "model = \"gpt-5\"\n[hooks.state.\"/other:stop:0:0\"]\nenabled = false";
        let with = with_trust(config, &found).unwrap();
        assert!(trusted(&with, &found) && !trusted(config, &found), "{with}");
        assert!(with.contains(r#"[hooks.state."/h/a \"b\"/hooks.json:session_start:1:0"]"#));
        assert_eq!(with_trust(&with, &found).unwrap(), with, "idempotent");
        assert_eq!(without_trust(&with), config);
        // A key Codex recorded itself is left to it.
        let recorded = format!(
            "{config}\n{}",
            &with[with.find("[hooks.state.\"/h").unwrap()..]
        );
        let again = with_trust(&without_trust(&recorded), &found).unwrap();
        assert_eq!(again.matches(START).count(), 0, "{again}");
        assert!(with_trust("hooks = { }\n", &found).is_err());
    }
}
