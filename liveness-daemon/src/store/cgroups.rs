//! Session cgroups in the store: what an emptied cgroup counted, kept in its session's
//! `cgroup` column, and the ended sessions whose cgroups a start may find left behind.

use rusqlite::params;

use super::rows::{append, event_about, get_session, json_value};
use super::{Store, StoreError};
use liveness_common::session::{
    CgroupEscape, CgroupUsage, Event, EventKind, Phase, Session, SessionCgroup, Unlisted,
};

impl Store {
    /// Stores what the session's cgroup counted (`cgroup.usage`), the escapes of its
    /// survivors (`cgroup.escaped`), beside those recorded as they happened, each process
    /// once, and what the cgroup held that its survivors do not list (`cgroup.unlisted`);
    /// a session gone by retention meanwhile is no error. No event: the end was published
    /// already.
    pub fn cgroup_usage(
        &mut self,
        uid: u32,
        id: &str,
        usage: &CgroupUsage,
        escaped: &[CgroupEscape],
        unlisted: Option<&Unlisted>,
    ) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        let mut all = match get_session(&tx, uid, id)?.and_then(|s| s.cgroup) {
            Some(cgroup) => cgroup.escaped,
            None => return Ok(()),
        };
        for escape in escaped {
            if !all.iter().any(|known| same_process(known, escape)) {
                all.push(escape.clone());
            }
        }
        tx.prepare_cached(
            "UPDATE sessions SET cgroup = json_set(cgroup, '$.usage', json(?3), \
                 '$.escaped', json(?4), '$.unlisted', json(?5)) \
                 WHERE creator_uid = ?1 AND id = ?2 AND cgroup IS NOT NULL",
        )?
        .execute(params![
            uid,
            id,
            json_value(Some(usage))?,
            json_value(Some(&all))?,
            json_value(unlisted)?
        ])?;
        tx.commit()?;
        Ok(())
    }

    /// Records that a process of user `uid`'s ACTIVE session `id` left its cgroup: kept in
    /// `cgroup.escaped` and announced by a `session.escaped`, in one transaction. `None`
    /// when the session is no longer active, has no cgroup, or knows that escape already.
    pub fn record_escape(
        &mut self,
        uid: u32,
        id: &str,
        escape: &CgroupEscape,
        now_ms: i64,
    ) -> Result<Option<Event>, StoreError> {
        let tx = self.write_tx()?;
        let Some(session) = get_session(&tx, uid, id)?.filter(|s| s.phase == Phase::Active) else {
            return Ok(None);
        };
        let Some(mut cgroup) = session.cgroup.clone() else {
            return Ok(None);
        };
        if cgroup
            .escaped
            .iter()
            .any(|known| same_process(known, escape))
        {
            return Ok(None);
        }
        cgroup.escaped.push(escape.clone());
        tx.prepare_cached("UPDATE sessions SET cgroup = ?3 WHERE creator_uid = ?1 AND id = ?2")?
            .execute(params![uid, id, json_value(Some(&cgroup))?])?;
        let event = append(
            &tx,
            Event {
                escape: Some(escape.clone()),
                ..event_about(EventKind::Escaped, &session, now_ms)
            },
        )?;
        tx.commit()?;
        Ok(Some(event))
    }

    /// Clears the cgroup of user `uid`'s session `id` if it is still `path` (systemd did
    /// not start its scope: no cgroup holds its processes); the session as written, or
    /// `None` when it had no such cgroup (gone by retention meanwhile). No event: a
    /// subscriber reads it with `get`.
    pub fn clear_cgroup(
        &mut self,
        uid: u32,
        id: &str,
        path: &str,
    ) -> Result<Option<Session>, StoreError> {
        let cleared = self
            .conn
            .prepare_cached(
                "UPDATE sessions SET cgroup = NULL \
                 WHERE creator_uid = ?1 AND id = ?2 AND json_extract(cgroup, '$.path') = ?3",
            )?
            .execute(params![uid, id, path])?;
        match cleared {
            0 => Ok(None),
            _ => self.get(uid, id),
        }
    }

    /// The ENDED sessions that had a cgroup: their creator, id and cgroup.
    pub fn ended_cgroups(&self) -> Result<Vec<(u32, String, SessionCgroup)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT creator_uid, id, cgroup FROM sessions \
             WHERE cgroup IS NOT NULL AND phase = 'ended'",
        )?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, u32>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(uid, id, cgroup)| Ok((uid, id, serde_json::from_str(&cgroup)?)))
            .collect()
    }
}

/// Whether two escapes are of one process: its pid and start time (a record written before
/// start times were kept has 0, and is the pid's).
fn same_process(a: &CgroupEscape, b: &CgroupEscape) -> bool {
    a.pid == b.pid && (a.start_ticks == b.start_ticks || a.start_ticks == 0 || b.start_ticks == 0)
}
