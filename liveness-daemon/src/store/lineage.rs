//! Which seqs a consumer's cursor may trust: the store and the daemon runs it was made in.
//!
//! Seqs go on from the newest one in the database. A state directory restored from an older
//! copy (or a snapshot taken while the daemon ran) goes back to that copy's newest seq and
//! hands out again seqs that a consumer may already have handled, for other events. So
//! each start of the daemon names a run, recorded with the newest seq at its start, and the
//! store id reported names the store and the current run. A cursor is kept only when its
//! run is one of this database's and its seq is one that run (or an earlier one) gave out
//! here; otherwise the consumer is told to `reset`.

/// The store and its runs, oldest first, each with the newest seq at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub(super) store: String,
    pub(super) runs: Vec<(String, u64)>,
}

impl Lineage {
    /// The store id as reported: the store's, then the current run's.
    pub fn id(&self) -> String {
        match self.runs.last() {
            Some((run, _)) => format!("{}.{run}", self.store),
            None => self.store.clone(),
        }
    }

    /// Whether a cursor at `since`, made in store id `store_id`, names events of this
    /// database. A store id without a run comes from before runs were recorded.
    pub fn holds(&self, store_id: &str, since: u64) -> bool {
        let (store, run) = match store_id.split_once('.') {
            Some((store, run)) => (store, Some(run)),
            None => (store_id, None),
        };
        if store != self.store {
            return false;
        }
        let next = match run {
            None => 0,
            Some(run) => match self.runs.iter().position(|(r, _)| r == run) {
                Some(at) => at + 1,
                // A run this database never had: the state was restored from a copy made
                // before it, and its seqs are given out again here.
                None => return false,
            },
        };
        // The next run here started after the newest seq the cursor's run gave out here.
        self.runs
            .get(next)
            .is_none_or(|(_, started_after)| since <= *started_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lineage(runs: &[(&str, u64)]) -> Lineage {
        Lineage {
            store: "ab12".into(),
            runs: runs.iter().map(|(r, s)| ((*r).to_owned(), *s)).collect(),
        }
    }

    #[test]
    fn the_id_names_the_current_run() {
        assert_eq!(lineage(&[("r1", 0), ("r2", 10)]).id(), "ab12.r2");
        assert_eq!(lineage(&[]).id(), "ab12");
    }

    #[test]
    fn a_cursor_holds_up_to_where_its_run_ended_here() {
        let here = lineage(&[("r1", 0), ("r2", 10), ("r3", 30)]);
        assert!(
            here.holds("ab12.r3", 45),
            "the current run: the head decides"
        );
        assert!(here.holds("ab12.r2", 30));
        assert!(here.holds("ab12.r2", 22));
        assert!(
            !here.holds("ab12.r2", 31),
            "r2 gave out nothing above 30 here"
        );
        assert!(here.holds("ab12.r1", 10));
        assert!(!here.holds("ab12.r1", 11));
        assert!(here.holds("ab12", 0), "from before runs were recorded");
        assert!(!here.holds("ab12", 1));
    }

    /// Stop at 10, copy, run r2 to 30, restore the copy: the next run starts after 10
    /// again, under another name. A cursor of r2 is void whatever its seq; one of r1 holds
    /// up to 10, which the copy has.
    #[test]
    fn a_cursor_of_a_run_the_restored_copy_never_had_is_void() {
        let restored = lineage(&[("r1", 0), ("r3", 10)]);
        assert!(!restored.holds("ab12.r2", 22));
        assert!(!restored.holds("ab12.r2", 5));
        assert!(restored.holds("ab12.r1", 10));
        assert!(!restored.holds("ab12.r1", 22), "a copy made while r1 ran");
        assert!(!restored.holds("cd34.r3", 5), "another store");
    }
}
