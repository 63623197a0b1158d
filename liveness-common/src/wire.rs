//! The words of the wire for text: what a value is called in the JSON.

use serde::Serialize;
use serde_json::Value;

/// The name a value has on the wire (`"active"`, `"owner_exited"`, `"ebpf"`), for text
/// that must use the same words as the JSON; empty for `None` or a non-string value.
pub fn wire_name(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => String::new(),
    }
}
