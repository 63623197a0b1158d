//! Process-tree members, persisted so that a restarted daemon still knows the orphans of a
//! live owner's tree.

use rusqlite::params;

use super::rows::{ticks_from_sql, ticks_to_sql};
use super::{Member, Store, StoreError};
use liveness_common::identity::ProcessKey;

impl Store {
    /// The persisted members of the tree of `root`.
    pub fn members_of(&self, root: ProcessKey) -> Result<Vec<Member>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT pid, start_ticks, comm, pidfs_ino FROM members \
             WHERE root_pid = ?1 AND root_start_ticks = ?2",
        )?;
        let members = stmt
            .query_map(params![root.pid, ticks_to_sql(root.start_ticks)], |row| {
                Ok(Member {
                    key: ProcessKey {
                        pid: row.get(0)?,
                        start_ticks: ticks_from_sql(row.get(1)?),
                    },
                    root,
                    comm: row.get(2)?,
                    pidfs_ino: row.get::<_, Option<i64>>(3)?.map(ticks_from_sql),
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(members)
    }

    /// Records members that joined and forgets those that died or whose tree is no longer
    /// followed, in one transaction.
    pub fn save_members(
        &mut self,
        added: &[Member],
        removed: &[ProcessKey],
    ) -> Result<(), StoreError> {
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let tx = self.write_tx()?;
        for member in added {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO members (pid, start_ticks, root_pid, root_start_ticks, \
                 comm, pidfs_ino) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                member.key.pid,
                ticks_to_sql(member.key.start_ticks),
                member.root.pid,
                ticks_to_sql(member.root.start_ticks),
                member.comm,
                member.pidfs_ino.map(ticks_to_sql),
            ])?;
        }
        for key in removed {
            tx.prepare_cached("DELETE FROM members WHERE pid = ?1 AND start_ticks = ?2")?
                .execute(params![key.pid, ticks_to_sql(key.start_ticks)])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets the members of every tree whose root is not in `roots`: trees of owners
    /// that died, or were replaced, while no daemon ran.
    pub fn keep_members_of(&mut self, roots: &[ProcessKey]) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        tx.execute_batch("CREATE TEMP TABLE IF NOT EXISTS kept_roots (pid, start_ticks)")?;
        tx.execute("DELETE FROM kept_roots", [])?;
        for root in roots {
            tx.prepare_cached("INSERT INTO kept_roots (pid, start_ticks) VALUES (?1, ?2)")?
                .execute(params![root.pid, ticks_to_sql(root.start_ticks)])?;
        }
        tx.execute(
            "DELETE FROM members WHERE NOT EXISTS (SELECT 1 FROM kept_roots \
             WHERE pid = root_pid AND start_ticks = root_start_ticks)",
            [],
        )?;
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: u32, start_ticks: u64) -> ProcessKey {
        ProcessKey { pid, start_ticks }
    }

    fn member(pid: u32, root: ProcessKey) -> Member {
        Member {
            key: key(pid, u64::from(pid) * 10),
            root,
            comm: format!("p{pid}"),
            pidfs_ino: Some(u64::from(pid) + 1000),
        }
    }

    #[test]
    fn members_persist_per_root_and_dead_trees_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let (a, b) = (key(1, 1), key(2, 2));
        {
            let mut store = Store::open(&path).unwrap();
            store
                .save_members(&[member(10, a), member(11, a), member(20, b)], &[])
                .unwrap();
            store.save_members(&[], &[member(11, a).key]).unwrap();
        }
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.members_of(a).unwrap(), [member(10, a)]);
        assert_eq!(store.members_of(b).unwrap(), [member(20, b)]);
        store.keep_members_of(&[b]).unwrap();
        assert_eq!(store.members_of(a).unwrap(), []);
        assert_eq!(store.members_of(b).unwrap(), [member(20, b)]);
    }
}
