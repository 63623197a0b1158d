//! `touch`: activity, which postpones the inactivity timeout of an owner that cannot be
//! watched, and the phase an agent's hooks declare (a turn, a tool), which the activity
//! sampler judges a stall by.

use crate::engine::Refusal;
use liveness_common::activity::MAX_TOOL_NAME;
use liveness_common::request::Touch;
use liveness_common::session::Session;

use super::{Op, addressed, stored};
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for Touch {
    type Answer = Session;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Session, Refusal> {
        check_tool(&self)?;
        let now = cx.now();
        let found = addressed(cx.store(), caller, &self.session, self.uid)?;
        let declares = self.turn.is_some() || self.tool.is_some() || self.tool_end;
        let declared = declares.then(|| {
            found.declared.clone().unwrap_or_default().declare(
                self.turn,
                self.tool.as_deref(),
                self.tool_end,
                now,
            )
        });
        // Activity has no event.
        cx.commit(|store| {
            store.touch(found.creator_uid, &self.session, now, declared.as_ref())?;
            Ok(((), Vec::new()))
        })?;
        let session = stored(cx.store(), found.creator_uid, &self.session)?;
        if declares {
            // The sampler reads the declared phase from the ACTIVE sessions kept in memory.
            cx.follow(session.clone());
        }
        Ok(session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}

/// A tool's name is shown to people: short, printable, and not with its end.
fn check_tool(touch: &Touch) -> Result<(), Refusal> {
    let invalid = |message: String| Err(Refusal::Invalid(message));
    if touch.tool.is_some() && touch.tool_end {
        return invalid("`tool` starts a tool and `tool_end` ends one: give one of them".into());
    }
    match touch.tool.as_deref() {
        Some("") => invalid("`tool` is empty".into()),
        Some(tool) if tool.len() > MAX_TOOL_NAME => {
            invalid(format!("`tool` is longer than {MAX_TOOL_NAME} bytes"))
        }
        Some(tool) if tool.chars().any(char::is_control) => {
            invalid("`tool` holds control characters".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(tool: Option<&str>, tool_end: bool) -> Touch {
        Touch {
            session: "s".into(),
            uid: None,
            turn: None,
            tool: tool.map(str::to_owned),
            tool_end,
        }
    }

    #[test]
    fn a_tool_name_is_short_printable_and_alone() {
        assert!(check_tool(&touch(Some("Bash"), false)).is_ok());
        assert!(check_tool(&touch(None, true)).is_ok());
        for bad in [
            touch(Some("Bash"), true),
            touch(Some(""), false),
            touch(Some("a\x1b[2J"), false),
        ] {
            assert!(check_tool(&bad).is_err(), "{bad:?}");
        }
        assert!(check_tool(&touch(Some(&"x".repeat(MAX_TOOL_NAME + 1)), false)).is_err());
    }
}
