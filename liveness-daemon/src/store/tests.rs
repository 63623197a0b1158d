use std::path::Path;

use liveness_common::lock::{Lock, ReleaseReason};
use liveness_common::protocol::StreamMessage;
use liveness_common::session::{
    DEFAULT_GRACE_MS, EventKind, OnEnd, Phase, ReapFailure, Reaped, Until,
};
use rusqlite::Connection;

use super::locks::MAX_LOCKS_PER_SESSION;
use super::schema::{MIGRATIONS, SCHEMA_VERSION};
use super::*;

const NOW: i64 = 1_700_000_000_000;
/// The uid that [`req`] registers as.
const UID: u32 = 1000;

fn only(session: &str) -> EventFilter {
    EventFilter {
        session: Some(session.to_owned()),
        creator_uid: None,
    }
}

fn owner(pid: u32) -> Identity {
    Identity {
        pid,
        start_ticks: 1000 + u64::from(pid),
        boot_id: "boot-a".into(),
        host: "devbox".into(),
        pidfs_ino: None,
        comm: "agent".into(),
    }
}

fn req(id: &str, owner: Identity) -> NewSession {
    NewSession {
        id: id.into(),
        owner,
        pending: false,
        pending_expires_ms: None,
        creator_uid: UID,
        labels: BTreeMap::from([("tool".into(), "claude".into())]),
        on_end: OnEnd::Leave,
        grace_ms: DEFAULT_GRACE_MS,
        until: Until::Owner,
        on_end_run: None,
        on_stall: None,
        cgroup: None,
        creator_gid: None,
    }
}

fn pending(id: &str, owner: Identity, expires_ms: i64) -> NewSession {
    NewSession {
        pending: true,
        pending_expires_ms: Some(expires_ms),
        ..req(id, owner)
    }
}

struct Db {
    dir: tempfile::TempDir,
}

impl Db {
    fn new() -> Db {
        Db {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("liveness.db")
    }
    fn open(&self) -> Store {
        Store::open(self.path()).unwrap()
    }
}

/// Registers sessions `s0`, `s1`... owned by processes 10, 11...
fn register_many(store: &mut Store, count: u32) {
    for i in 0..count {
        store
            .register(req(&format!("s{i}"), owner(10 + i)), NOW)
            .unwrap();
    }
}

fn exited(code: u8) -> Option<ExitStatus> {
    Some(ExitStatus::Exited { code })
}

fn end_by_owner(store: &mut Store, who: &Identity) -> Vec<Event> {
    end_owner(store, who, exited(0), DetectedBy::Pidfd, NOW + 5, NOW + 6)
}

/// Ends every active session of `owner`, as a lone death in a burst would.
fn end_owner(
    store: &mut Store,
    owner: &Identity,
    exit: Option<ExitStatus>,
    detected_by: DetectedBy,
    observed_ms: i64,
    now_ms: i64,
) -> Vec<Event> {
    store
        .end_many(
            &[OwnerDeath {
                owner: owner.clone(),
                reason: EndReason::OwnerExited,
                exit,
                detected_by,
                observed_ms,
                died_ms: None,
                survivors: None,
                cause: None,
                usage: None,
                sender_root: None,
                tree_cgroups: Default::default(),
            }],
            now_ms,
        )
        .unwrap()
}

fn events(page: EventPage) -> Vec<Event> {
    match page {
        EventPage::Events(stored) => stored
            .into_iter()
            .map(|s| {
                let event: Event = serde_json::from_str(&s.body).unwrap();
                assert_eq!(event.seq, s.seq);
                event
            })
            .collect(),
        gap => panic!("expected events, got {gap:?}"),
    }
}

#[test]
fn register_then_new_owner_is_owner_changed() {
    let db = Db::new();
    let mut store = db.open();
    let first = store.register(req("s1", owner(10)), NOW).unwrap();
    let event = first.event.unwrap();
    assert_eq!((event.seq, event.kind), (1, EventKind::Registered));
    assert_eq!(event.owner, owner(10));
    assert_eq!(first.session.phase, Phase::Active);
    assert_eq!(store.get(UID, "s1").unwrap(), Some(first.session.clone()));

    // The same process again (even after an exec renamed it): idempotent, no event.
    let again = Identity {
        comm: "exec'd".into(),
        ..owner(10)
    };
    let same = store.register(req("s1", again), NOW + 1).unwrap();
    assert_eq!(same.event, None);
    assert_eq!(same.session.owner, owner(10));
    assert_eq!(same.session.touched_ms, NOW + 1);
    assert_eq!(store.head_seq().unwrap(), 1);

    let turn = store.register(req("s1", owner(11)), NOW + 2).unwrap();
    let event = turn.event.unwrap();
    assert_eq!((event.seq, event.kind), (2, EventKind::OwnerChanged));
    assert_eq!(event.owner, owner(11));
    assert_eq!(event.previous_owner, Some(owner(10)));
    assert_eq!(store.get(UID, "s1").unwrap().unwrap().owner, owner(11));
}

#[test]
fn only_the_current_owner_ends_a_session_exactly_once() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("s1", owner(10)), NOW).unwrap();
    store.register(req("s1", owner(11)), NOW + 1).unwrap();

    assert!(end_by_owner(&mut store, &owner(10)).is_empty());
    let stale = store
        .end(
            UID,
            "s1",
            Some(&owner(10)),
            &Ending {
                detected_by: Some(DetectedBy::Ebpf),
                ..Ending::because(EndReason::OwnerExited)
            },
            NOW + 2,
        )
        .unwrap();
    assert!(
        stale.is_empty(),
        "an old owner's death never ends a new turn"
    );
    assert_eq!(store.get(UID, "s1").unwrap().unwrap().phase, Phase::Active);

    let ended = end_by_owner(&mut store, &owner(11));
    assert_eq!(ended.len(), 1);
    let event = &ended[0];
    assert_eq!((event.seq, event.kind), (3, EventKind::Ended));
    assert_eq!(event.reason, Some(EndReason::OwnerExited));
    assert_eq!(event.exit, exited(0));
    assert_eq!(event.detected_by, Some(DetectedBy::Pidfd));
    assert_eq!((event.observed_ms, event.at_ms), (Some(NOW + 5), NOW + 6));
    let session = store.get(UID, "s1").unwrap().unwrap();
    assert_eq!(session.phase, Phase::Ended);
    assert_eq!(session.ended_ms, Some(NOW + 6));

    // A second source reporting the same death, or an explicit stop: nothing more.
    assert!(end_by_owner(&mut store, &owner(11)).is_empty());
    let stop = store.end(
        UID,
        "s1",
        None,
        &Ending::because(EndReason::Stopped),
        NOW + 7,
    );
    assert!(stop.unwrap().is_empty());
    assert_eq!(store.head_seq().unwrap(), 3);
    assert!(matches!(
        store.end(UID, "nope", None, &Ending::because(EndReason::Stopped), NOW),
        Err(StoreError::NotFound(id)) if id == "nope"
    ));
}

#[test]
fn end_by_id_with_and_without_expected_owner() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    store.register(req("b", owner(10)), NOW).unwrap();
    let event = store
        .end(
            UID,
            "a",
            Some(&owner(10)),
            &Ending {
                detected_by: Some(DetectedBy::Reconcile),
                observed_ms: Some(NOW),
                ..Ending::because(EndReason::OwnerReused)
            },
            NOW + 1,
        )
        .unwrap()
        .remove(0);
    assert_eq!(event.reason, Some(EndReason::OwnerReused));
    let event = store
        .end(
            UID,
            "b",
            None,
            &Ending::because(EndReason::Timeout),
            NOW + 2,
        )
        .unwrap()
        .remove(0);
    assert_eq!(
        (event.reason, event.detected_by, event.exit),
        (Some(EndReason::Timeout), None, None)
    );
    assert_eq!(store.get(UID, "b").unwrap().unwrap().detected_by, None);
}

#[test]
fn sessions_sharing_an_owner_all_end() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("b", owner(10)), NOW).unwrap();
    store.register(req("a", owner(10)), NOW).unwrap();
    store.register(req("c", owner(20)), NOW).unwrap();
    assert_eq!(store.active_owners().unwrap().len(), 2);
    let mine = store.active_sessions_of_owner(&owner(10)).unwrap();
    assert_eq!(
        mine.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );

    let ended = end_by_owner(&mut store, &owner(10));
    let ids: Vec<_> = ended.iter().map(|e| (e.seq, e.session.as_str())).collect();
    assert_eq!(ids, [(4, "a"), (5, "b")]);
    assert_eq!(store.active_owners().unwrap(), [owner(20)]);
    assert!(
        store
            .active_sessions_of_owner(&owner(10))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn owner_fingerprint_includes_boot_but_not_host() {
    let db = Db::new();
    let mut store = db.open();
    let with_ino = Identity {
        pidfs_ino: Some(77),
        ..owner(10)
    };
    store.register(req("s", with_ino.clone()), NOW).unwrap();
    assert_eq!(store.get(UID, "s").unwrap().unwrap().owner, with_ino);
    assert_eq!(store.active_owners().unwrap(), [with_ino]);
    for other in [
        Identity {
            start_ticks: 1,
            ..owner(10)
        },
        Identity {
            boot_id: "boot-b".into(),
            ..owner(10)
        },
    ] {
        assert!(end_by_owner(&mut store, &other).is_empty(), "{other:?}");
    }
    // The host name changed while the process ran: its death still ends the session.
    let renamed = Identity {
        host: "renamed".into(),
        ..owner(10)
    };
    assert_eq!(end_by_owner(&mut store, &renamed).len(), 1);
}

#[test]
fn boots_run_on_are_remembered() {
    let db = Db::new();
    let mut store = db.open();
    assert!(!store.is_known_boot("boot-a").unwrap());
    store.begin_run("boot-a").unwrap();
    store.begin_run("boot-b").unwrap();
    assert!(store.is_known_boot("boot-a").unwrap());
    assert!(store.is_known_boot("boot-b").unwrap());
    assert!(!db.open().is_known_boot("boot-c").unwrap());
}

#[test]
fn pending_session_is_renamed() {
    let db = Db::new();
    let mut store = db.open();
    store
        .register(pending("pending-10", owner(10), NOW + 60_000), NOW)
        .unwrap();
    assert!(store.expired_pending(NOW + 59_999).unwrap().is_empty());
    assert_eq!(store.expired_pending(NOW + 60_000).unwrap().len(), 1);

    let event = store.rename(UID, "pending-10", "real", NOW + 1).unwrap();
    assert_eq!((event.seq, event.kind), (2, EventKind::Renamed));
    assert_eq!(event.session, "real");
    assert_eq!(event.previous_session.as_deref(), Some("pending-10"));
    assert_eq!(store.get(UID, "pending-10").unwrap(), None);
    let session = store.get(UID, "real").unwrap().unwrap();
    assert!(!session.pending);
    assert_eq!(session.pending_expires_ms, None);
    assert_eq!(session.created_ms, NOW);
    assert!(store.expired_pending(NOW + 60_000).unwrap().is_empty());
    assert_eq!(end_by_owner(&mut store, &owner(10))[0].session, "real");
}

#[test]
fn rename_errors_change_nothing() {
    let db = Db::new();
    let mut store = db.open();
    store.register(pending("p1", owner(10), NOW), NOW).unwrap();
    store.register(pending("p2", owner(11), NOW), NOW).unwrap();
    store.register(req("real", owner(12)), NOW).unwrap();
    store
        .end(
            UID,
            "p2",
            None,
            &Ending::because(EndReason::PendingExpired),
            NOW,
        )
        .unwrap();
    let head = store.head_seq().unwrap();

    assert!(matches!(
        store.rename(UID, "missing", "x", NOW),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.rename(UID, "real", "x", NOW),
        Err(StoreError::NotPending(id)) if id == "real"
    ));
    assert!(matches!(
        store.rename(UID, "p1", "real", NOW),
        Err(StoreError::AlreadyExists(id)) if id == "real"
    ));
    assert!(matches!(
        store.rename(UID, "p1", "p1", NOW),
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        store.rename(UID, "p2", "x", NOW),
        Err(StoreError::AlreadyEnded(_))
    ));
    assert!(matches!(
        store.rename(UID, "p1", "", NOW),
        Err(StoreError::InvalidId(_))
    ));
    assert_eq!(store.head_seq().unwrap(), head);
    assert!(store.get(UID, "p1").unwrap().unwrap().pending);
    assert_eq!(store.get(UID, "x").unwrap(), None);
}

#[test]
fn only_idle_owners_of_other_boots_time_out() {
    let db = Db::new();
    let mut store = db.open();
    let on = |boot: &str, pid| Identity {
        boot_id: boot.into(),
        ..owner(pid)
    };
    // Hosts sorting before and after the local one, both idle and busy.
    store
        .register(req("zulu-idle", on("zulu", 1)), NOW)
        .unwrap();
    store
        .register(req("alpha-idle", on("alpha", 2)), NOW)
        .unwrap();
    store
        .register(req("local-idle", on("boot-a", 3)), NOW)
        .unwrap();
    store
        .register(req("alpha-busy", on("alpha", 4)), NOW)
        .unwrap();
    store.touch(UID, "alpha-busy", NOW + 100, None).unwrap();
    store
        .register(req("zulu-ended", on("zulu", 5)), NOW)
        .unwrap();
    end_by_owner(&mut store, &on("zulu", 5));

    let idle = store.idle_of_other_boots(NOW + 50, "boot-a").unwrap();
    assert_eq!(
        idle.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["alpha-idle", "zulu-idle"]
    );
    assert!(store.idle_of_other_boots(NOW, "boot-a").unwrap().is_empty());
}

#[test]
fn ended_id_cannot_be_registered_again_until_pruned() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("s", owner(10)), NOW).unwrap();
    end_by_owner(&mut store, &owner(10));
    assert!(matches!(
        store.register(req("s", owner(11)), NOW + 10),
        Err(StoreError::AlreadyEnded(id)) if id == "s"
    ));
    assert!(matches!(
        store.touch(UID, "s", NOW, None),
        Err(StoreError::AlreadyEnded(_))
    ));
    assert_eq!(store.head_seq().unwrap(), 2);

    assert_eq!(store.prune_sessions(NOW + 6).unwrap(), 0);
    assert_eq!(store.prune_sessions(NOW + 7).unwrap(), 1);
    assert_eq!(store.get(UID, "s").unwrap(), None);
    assert!(store.register(req("s", owner(11)), NOW + 10).is_ok());
}

#[test]
fn touch_list_and_idle() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    store
        .register(
            NewSession {
                creator_uid: 0,
                ..req("b", owner(11))
            },
            NOW + 1,
        )
        .unwrap();
    store.register(req("c", owner(12)), NOW + 2).unwrap();
    end_by_owner(&mut store, &owner(12));
    store.touch(UID, "a", NOW + 100, None).unwrap();
    assert!(matches!(
        store.touch(UID, "zz", NOW, None),
        Err(StoreError::NotFound(_))
    ));

    let idle = store.idle_of_other_boots(NOW + 50, "boot-z").unwrap();
    assert_eq!(idle.iter().map(|s| &s.id).collect::<Vec<_>>(), ["b"]);
    let ids = |phase, creator_uid| {
        let query = ListQuery {
            phase,
            creator_uid,
            after: 0,
            limit: 10,
        };
        let page = store.list(&query).unwrap();
        assert_eq!(page.next, None, "one page holds them all");
        page.sessions.into_iter().map(|s| s.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(None, None), ["a", "b", "c"]);
    assert_eq!(ids(Some(Phase::Active), None), ["a", "b"]);
    assert_eq!(ids(Some(Phase::Ended), None), ["c"]);
    assert_eq!(ids(None, Some(1000)), ["a", "c"]);
    assert_eq!(ids(Some(Phase::Active), Some(0)), ["b"]);
    assert_eq!(store.count(Phase::Active).unwrap(), 2);
    assert_eq!(store.count(Phase::Ended).unwrap(), 1);
}

fn sessions_in(path: &Path) -> Vec<String> {
    let store = Store::open(path).unwrap();
    let query = ListQuery {
        limit: 1000,
        ..ListQuery::default()
    };
    let page = store.list(&query).unwrap();
    page.sessions.into_iter().map(|s| s.id).collect()
}

#[test]
fn a_truncated_database_is_refused_until_recovered() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("s", owner(10)), NOW).unwrap();
    drop(store);
    std::fs::File::create(db.path()).unwrap();
    let refused = Store::open(db.path()).expect_err("an empty database file");
    assert!(matches!(refused, StoreError::Damaged { .. }), "{refused}");
    assert!(refused.to_string().contains("--recover"), "{refused}");
    assert_eq!(
        std::fs::metadata(db.path()).unwrap().len(),
        0,
        "left as it was"
    );

    let recovered = Store::recover(&db.path()).unwrap();
    let aside = recovered.aside.expect("the damaged file is kept");
    assert!(aside.exists(), "{}", aside.display());
    assert_eq!((recovered.sessions, recovered.events), (0, 0));
    let store = db.open();
    assert_eq!(store.head_seq().unwrap(), SEQ_JUMP_AFTER_POWER_LOSS);
    assert!(
        Store::recover(&db.path()).unwrap().aside.is_none(),
        "intact now"
    );
}

#[test]
fn overwritten_pages_are_refused_and_what_is_readable_is_recovered() {
    use std::io::{Seek, SeekFrom, Write};
    let db = Db::new();
    let mut store = db.open();
    let damaged_store = store.store_id().unwrap();
    for i in 0..200 {
        let labels = BTreeMap::from([("pad".to_owned(), "x".repeat(300))]);
        store
            .register(
                NewSession {
                    labels,
                    ..req(&format!("s{i:03}"), owner(10 + i))
                },
                NOW,
            )
            .unwrap();
    }
    drop(store);
    assert_eq!(sessions_in(&db.path()).len(), 200);
    let length = std::fs::metadata(db.path()).unwrap().len();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(db.path())
        .unwrap();
    // Garbage over a page in the middle (pages are 4 KiB; page 1 holds the header).
    file.seek(SeekFrom::Start(length / 2 / 4096 * 4096))
        .unwrap();
    file.write_all(&[0xa5; 4096]).unwrap();
    drop(file);
    let refused = Store::open(db.path()).expect_err("a page of garbage");
    assert!(matches!(refused, StoreError::Damaged { .. }), "{refused}");

    let recovered = Store::recover(&db.path()).unwrap();
    assert!(recovered.aside.is_some());
    let kept = sessions_in(&db.path());
    assert_eq!(kept.len() as u64, recovered.sessions);
    // Which rows survive depends on what the garbage hit (a table or an index page).
    assert!(
        (1..=200).contains(&kept.len()),
        "{} sessions read back",
        kept.len()
    );
    assert_ne!(
        db.open().store_id().unwrap(),
        damaged_store,
        "a recovered database is a new store: its consumers are told to start over"
    );
}

#[test]
fn a_deleted_or_replaced_file_is_noticed() {
    let db = Db::new();
    let store = db.open();
    store.check_file().expect("the file opened");
    std::fs::remove_file(db.path()).unwrap();
    let deleted = store.check_file().expect_err("deleted");
    assert!(deleted.to_string().contains("deleted"), "{deleted}");
    std::fs::write(db.path(), b"").unwrap();
    let replaced = store.check_file().expect_err("replaced");
    assert!(replaced.to_string().contains("replaced"), "{replaced}");
}

#[test]
fn lists_page_through_every_session_once() {
    let db = Db::new();
    let mut store = db.open();
    register_many(&mut store, 7);
    let reader = EventReader::open(db.path()).unwrap();
    let mut seen = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let query = ListQuery {
            after,
            limit: 3,
            ..ListQuery::default()
        };
        let page = reader.list(&query).unwrap();
        pages += 1;
        seen.extend(page.sessions.into_iter().map(|s| s.id));
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(seen, ["s0", "s1", "s2", "s3", "s4", "s5", "s6"]);
    assert_eq!(pages, 3);
}

#[test]
fn bad_ids_are_rejected_and_nothing_is_written() {
    let db = Db::new();
    let mut store = db.open();
    let long = "x".repeat(MAX_ID_LEN + 1);
    for bad in [
        "",
        long.as_str(),
        "a\nb",
        "tab\there",
        "del\u{7f}",
        "\u{85}",
        // Displayed as "evil" + "txt.exe" reversed, or as another id.
        "right-to-left\u{202E}override",
        "embedding\u{202A}",
        "isolate\u{2066}x\u{2069}",
        "zero\u{200B}width",
        "joiner\u{200D}",
        "word\u{2060}joiner",
        "\u{FEFF}bom",
    ] {
        assert!(
            matches!(
                store.register(req(bad, owner(10)), NOW),
                Err(StoreError::InvalidId(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(store.head_seq().unwrap(), 0);
    assert_eq!(store.count(Phase::Active).unwrap(), 0);

    let longest = "é".repeat(MAX_ID_LEN / 2);
    assert!(store.register(req(&longest, owner(10)), NOW).is_ok());
    assert!(
        store
            .register(req("with space/and:punct", owner(10)), NOW)
            .is_ok()
    );
}

#[test]
fn seq_survives_reopen_and_is_never_reused_after_prune() {
    let db = Db::new();
    {
        let mut store = db.open();
        for i in 0..3 {
            store
                .register(req(&format!("s{i}"), owner(10)), NOW)
                .unwrap();
        }
    }
    let mut store = db.open();
    assert_eq!(store.head_seq().unwrap(), 3);
    let event = store
        .register(req("s3", owner(10)), NOW)
        .unwrap()
        .event
        .unwrap();
    assert_eq!(event.seq, 4);

    assert_eq!(store.prune(0, i64::MAX, NOW).unwrap(), 4);
    assert_eq!(store.head_seq().unwrap(), 4);
    drop(store);
    let mut store = db.open();
    let event = store
        .register(req("s4", owner(10)), NOW)
        .unwrap()
        .event
        .unwrap();
    assert_eq!(event.seq, 5, "seqs continue after everything was pruned");
    assert_eq!(
        events(store.events_after(4, 10, &EventFilter::default()).unwrap()),
        [event]
    );
    assert_eq!(
        store.events_after(3, 10, &EventFilter::default()).unwrap(),
        EventPage::Gap {
            requested_since: 3,
            pruned_through: 4
        }
    );
}

#[test]
fn events_after_replays_exactly_what_follows() {
    let db = Db::new();
    let mut store = db.open();
    let mut all = Vec::new();
    for i in 0..5u32 {
        let r = store.register(req(&format!("s{}", i % 2), owner(10 + i)), NOW);
        all.push(r.unwrap().event.unwrap());
    }
    all.extend(end_by_owner(&mut store, &owner(14)));
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );

    assert_eq!(
        events(store.events_after(0, 100, &EventFilter::default()).unwrap()),
        all
    );
    assert_eq!(
        events(store.events_after(2, 100, &EventFilter::default()).unwrap()),
        all[2..]
    );
    assert_eq!(
        events(store.events_after(2, 2, &EventFilter::default()).unwrap()),
        all[2..4]
    );
    assert!(events(store.events_after(6, 100, &EventFilter::default()).unwrap()).is_empty());
    let s0: Vec<_> = all.iter().filter(|e| e.session == "s0").cloned().collect();
    assert_eq!(s0.len(), 4);
    assert_eq!(events(store.events_after(0, 100, &only("s0")).unwrap()), s0);
    assert_eq!(
        events(store.events_after(1, 2, &only("s0")).unwrap()),
        s0[1..3]
    );
    assert!(events(store.events_after(0, 100, &only("none")).unwrap()).is_empty());
}

#[test]
fn events_after_filters_by_creator() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("mine", owner(10)), NOW).unwrap();
    let theirs = NewSession {
        creator_uid: 2000,
        ..req("theirs", owner(11))
    };
    store.register(theirs, NOW).unwrap();
    let mine = EventFilter {
        session: None,
        creator_uid: Some(1000),
    };
    let got = events(store.events_after(0, 10, &mine).unwrap());
    let sessions: Vec<_> = got
        .iter()
        .map(|e| (e.session.as_str(), e.creator_uid))
        .collect();
    assert_eq!(sessions, [("mine", 1000)]);
}

/// The replay's filter (SQL) and the live stream's (`admits`) are one test: for every
/// filter, the replay returns exactly the stored events `admits` lets through.
#[test]
fn the_sql_filter_and_admits_agree() {
    let db = Db::new();
    let mut store = db.open();
    for (id, uid, pid) in [
        ("a", 1000, 10),
        ("b", 1000, 11),
        ("a", 2000, 12),
        ("c", 2000, 13),
    ] {
        let new = NewSession {
            creator_uid: uid,
            ..req(id, owner(pid))
        };
        store.register(new, NOW).unwrap();
    }
    let all = events(store.events_after(0, 100, &EventFilter::default()).unwrap());
    assert_eq!(all.len(), 4);
    for session in [None, Some("a"), Some("c"), Some("none")] {
        for creator_uid in [None, Some(1000), Some(2000), Some(3000)] {
            let filter = EventFilter {
                session: session.map(str::to_owned),
                creator_uid,
            };
            let replayed: Vec<u64> = events(store.events_after(0, 100, &filter).unwrap())
                .iter()
                .map(|e| e.seq)
                .collect();
            let admitted: Vec<u64> = all
                .iter()
                .filter(|e| filter.admits(&e.session, e.creator_uid))
                .map(|e| e.seq)
                .collect();
            assert_eq!(replayed, admitted, "{filter:?}");
        }
    }
}

/// A replay pages through the stored events up to a head, as stream lines, and says where
/// retention left a gap.
#[test]
fn a_replay_yields_stream_lines_up_to_the_head_and_its_gaps() {
    let db = Db::new();
    let mut store = db.open();
    register_many(&mut store, 5);
    let reader = EventReader::open(db.path()).unwrap();
    let all = EventFilter::default();
    let first = reader.replay(0, 4, &all, 3).unwrap();
    assert_eq!(first.next, Some(3), "a full page goes on");
    let lines: Vec<StreamMessage> = first
        .lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seqs: Vec<u64> = lines
        .iter()
        .map(|line| match line {
            StreamMessage::Event(event) => event.seq,
            other => panic!("an event line, got {other:?}"),
        })
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let last = reader.replay(3, 4, &all, 3).unwrap();
    assert_eq!(
        (last.lines.len(), last.next),
        (1, None),
        "event 5 is past the head"
    );

    store.prune(2, i64::MAX, NOW).unwrap();
    let gap = reader.replay(0, 5, &all, 3).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&gap.lines[0]).unwrap(),
        serde_json::json!({"gap": {"since": 0, "pruned_through": 3}})
    );
    assert_eq!(gap.next, Some(3), "the replay goes on after the gap");
}

#[test]
fn prune_by_age_and_count_reports_gaps() {
    let db = Db::new();
    let mut store = db.open();
    for i in 0..10 {
        store
            .register(req(&format!("s{i}"), owner(10)), NOW + i * 1000)
            .unwrap();
    }
    // Older than 5 s at NOW + 10 s: the events at +0 .. +4 s.
    assert_eq!(store.prune(100, 5_000, NOW + 10_000).unwrap(), 5);
    assert!(matches!(
        store.events_after(5, 100, &EventFilter::default()).unwrap(),
        EventPage::Events(v) if v.len() == 5
    ));
    assert_eq!(
        store.events_after(0, 100, &EventFilter::default()).unwrap(),
        EventPage::Gap {
            requested_since: 0,
            pruned_through: 5
        }
    );
    // Count bound: keep the newest 3.
    assert_eq!(store.prune(3, i64::MAX, NOW).unwrap(), 2);
    assert!(matches!(
        store.events_after(4, 100, &only("s9")).unwrap(),
        EventPage::Gap {
            pruned_through: 7,
            ..
        }
    ));
    assert_eq!(
        events(store.events_after(7, 100, &EventFilter::default()).unwrap())
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [8, 9, 10]
    );
    assert_eq!(
        store.prune(3, i64::MAX, NOW).unwrap(),
        0,
        "nothing more to do"
    );
}

#[test]
fn seqs_jump_only_after_an_unclean_stop_on_another_boot() {
    let db = Db::new();
    let next_seq = |store: &mut Store, id: &str| {
        store
            .register(req(id, owner(10)), NOW)
            .unwrap()
            .event
            .unwrap()
            .seq
    };
    let mut store = db.open();
    assert!(
        !store.begin_run("boot-a").unwrap(),
        "a new database has nothing to protect"
    );
    assert_eq!(next_seq(&mut store, "a"), 1);
    drop(store);
    // Killed, restarted on the same boot: nothing can have been lost.
    let mut store = db.open();
    assert!(!store.begin_run("boot-a").unwrap());
    assert_eq!(next_seq(&mut store, "b"), 2);
    drop(store);
    // Not stopped cleanly, and now another boot: maybe a power loss.
    let mut store = db.open();
    assert!(store.begin_run("boot-b").unwrap());
    assert_eq!(next_seq(&mut store, "c"), 3 + SEQ_JUMP_AFTER_POWER_LOSS);
    store.end_run().unwrap();
    drop(store);
    let mut store = db.open();
    assert!(
        !store.begin_run("boot-c").unwrap(),
        "after a clean stop the boot does not matter"
    );
    assert_eq!(next_seq(&mut store, "d"), 4 + SEQ_JUMP_AFTER_POWER_LOSS);
}

#[test]
fn open_sets_wal_and_the_schema_version() {
    let db = Db::new();
    let store = db.open();
    let pragma = |name: &str| {
        store
            .conn
            .pragma_query_value(None, name, |r| r.get::<_, rusqlite::types::Value>(0))
            .unwrap()
    };
    use rusqlite::types::Value;
    assert_eq!(pragma("journal_mode"), Value::Text("wal".into()));
    assert_eq!(pragma("synchronous"), Value::Integer(1), "NORMAL");
    assert_eq!(pragma("foreign_keys"), Value::Integer(1));
    assert_eq!(
        pragma("user_version"),
        Value::Integer(SCHEMA_VERSION.into())
    );
    drop(store);
    // Reopening an up-to-date database migrates nothing and keeps the data.
    let mut store = db.open();
    store.register(req("s", owner(10)), NOW).unwrap();
    drop(store);
    assert!(db.open().get(UID, "s").unwrap().is_some());
}

#[test]
fn a_first_version_database_is_migrated_with_its_sessions() {
    let db = Db::new();
    let conn = Connection::open(db.path()).unwrap();
    conn.execute_batch(MIGRATIONS[0]).unwrap();
    conn.pragma_update(None, "user_version", 1).unwrap();
    conn.execute(
        "INSERT INTO sessions (id, owner_pid, owner_start_ticks, owner_boot_id, owner_host, \
         owner_comm, phase, pending, creator_uid, labels, created_ms, updated_ms, touched_ms) \
         VALUES ('old', 7, 1007, 'boot-a', 'elsewhere', 'agent', 'active', 0, 1000, '{}', \
         ?1, ?1, ?1)",
        [NOW],
    )
    .unwrap();
    conn.execute(
        "UPDATE meta SET value = 'boot-old' WHERE key = 'run_boot_id'",
        [],
    )
    .unwrap();
    drop(conn);

    let store = db.open();
    assert!(
        store.is_known_boot("boot-old").unwrap(),
        "the boot of the last run is known after the migration"
    );
    assert_eq!(
        store.get(1000, "old").unwrap().unwrap().owner.pidfs_ino,
        None
    );
    let version: u32 = store
        .conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    // The queries that need the new indexes (INDEXED BY fails without them) see the row.
    let idle = store.idle_of_other_boots(NOW + 1, "boot-z").unwrap();
    assert_eq!(
        idle.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["old"]
    );
    assert!(store.expired_pending(NOW + 1).unwrap().is_empty());
    assert!(
        store.get(1000, "old").unwrap().is_some(),
        "the session is in its creator's namespace"
    );
    assert_eq!(
        store.store_id().unwrap().len(),
        32,
        "the store got an identity"
    );
}

#[test]
fn session_ids_are_per_user() {
    let db = Db::new();
    let mut store = db.open();
    let other = |id: &str, pid| NewSession {
        creator_uid: 2000,
        ..req(id, owner(pid))
    };
    store.register(req("shared", owner(10)), NOW).unwrap();
    let theirs = store.register(other("shared", 20), NOW).unwrap();
    assert!(
        theirs.event.is_some(),
        "a second user's registration of the same text is a new session, not a new owner"
    );
    assert_eq!(store.get(UID, "shared").unwrap().unwrap().owner, owner(10));
    assert_eq!(store.get(2000, "shared").unwrap().unwrap().owner, owner(20));
    let uids: Vec<u32> = store
        .find_any_user("shared")
        .unwrap()
        .iter()
        .map(|s| s.creator_uid)
        .collect();
    assert_eq!(uids, [UID, 2000]);

    // Each user's operations stay in its own namespace.
    let ended = store
        .end(
            UID,
            "shared",
            None,
            &Ending::because(EndReason::Stopped),
            NOW + 1,
        )
        .unwrap();
    assert!(!ended.is_empty());
    assert_eq!(
        store.get(2000, "shared").unwrap().unwrap().phase,
        Phase::Active
    );
    assert!(matches!(
        store.touch(3000, "shared", NOW, None),
        Err(StoreError::NotFound(_))
    ));
    store.register(other("pending-1", 21), NOW).unwrap();
    store.register(req("taken", owner(11)), NOW).unwrap();
    store
        .rename(2000, "pending-1", "taken", NOW)
        .map_err(|e| e.to_string())
        .expect_err("only a pending session renames");
    store
        .register(
            NewSession {
                pending: true,
                ..other("pending-2", 22)
            },
            NOW,
        )
        .unwrap();
    store
        .rename(2000, "pending-2", "taken", NOW)
        .expect("another user's id does not block a rename");
    assert_eq!(store.get(UID, "taken").unwrap().unwrap().owner, owner(11));
    assert_eq!(store.get(2000, "taken").unwrap().unwrap().owner, owner(22));
}

#[test]
fn the_store_id_is_random_and_kept() {
    let (first, second) = (Db::new(), Db::new());
    let id = first.open().store_id().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id:?}"
    );
    assert_eq!(first.open().store_id().unwrap(), id, "kept across opens");
    assert_ne!(second.open().store_id().unwrap(), id, "each store its own");
}

/// Each start names a run after the newest seq then; the store id reported names the
/// store and that run. A copy made before a run does not hold that run's cursors.
#[test]
fn each_run_is_recorded_with_the_seq_it_started_after() {
    let db = Db::new();
    let mut store = db.open();
    let store_id = store.store_id().unwrap();
    store.begin_run("boot").unwrap();
    register_many(&mut store, 3);
    let first = store.lineage().unwrap().id();
    assert!(first.starts_with(&format!("{store_id}.")), "{first}");
    store.end_run().unwrap();
    // Closed, so that the file holds every commit.
    drop(store);
    let copy = Db::new();
    std::fs::copy(db.path(), copy.path()).unwrap();

    let mut store = db.open();
    store.begin_run("boot").unwrap();
    register_many(&mut store, 5);
    let second = store.lineage().unwrap();
    assert_ne!(second.id(), first, "a new run");
    assert!(second.holds(&first, 3));
    assert!(!second.holds(&first, 4), "the first run handed out 1..=3");
    assert!(second.holds(&second.id(), 5));

    let mut restored = copy.open();
    restored.begin_run("boot").unwrap();
    let restored = restored.lineage().unwrap();
    assert!(
        restored.holds(&first, 3),
        "the copy has the first run's events"
    );
    assert!(!restored.holds(&second.id(), 4), "not the second run's");
}

#[test]
fn a_second_version_database_keeps_its_events_and_seq_head() {
    let db = Db::new();
    let mut conn = Connection::open(db.path()).unwrap();
    for (version, sql) in MIGRATIONS[..2].iter().enumerate() {
        conn.execute_batch(sql).unwrap();
        conn.pragma_update(None, "user_version", version as i64 + 1)
            .unwrap();
    }
    let tx = conn.transaction().unwrap();
    for seq in 1..=3 {
        tx.execute(
            "INSERT INTO events (seq, kind, session, creator_uid, at_ms, body) \
             VALUES (?1, 'session.registered', 's', 0, 0, '{}')",
            [seq],
        )
        .unwrap();
    }
    // What begin_run left after a possible power loss: the counter ahead of the events.
    tx.execute(
        "UPDATE sqlite_sequence SET seq = 5000 WHERE name = 'events'",
        [],
    )
    .unwrap();
    tx.commit().unwrap();
    drop(conn);

    let mut store = db.open();
    assert_eq!(store.head_seq().unwrap(), 5000, "the jumped head survives");
    match store.events_after(0, 10, &only("s")).unwrap() {
        EventPage::Events(stored) => {
            assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3])
        }
        gap => panic!("expected the three events, got {gap:?}"),
    }
    let registered = store.register(req("after", owner(9)), NOW).unwrap();
    assert_eq!(registered.event.unwrap().seq, 5001);
    let autoincrement: i64 = store
        .conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE sql LIKE '%AUTOINCREMENT%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(autoincrement, 0, "no table keeps AUTOINCREMENT");
}

#[test]
fn schema_newer_than_the_code_is_refused() {
    let db = Db::new();
    drop(db.open());
    Connection::open(db.path())
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    assert!(matches!(
        Store::open(db.path()),
        Err(StoreError::SchemaTooNew {
            found: 99,
            supported: SCHEMA_VERSION
        })
    ));
    assert!(matches!(
        EventReader::open(db.path()),
        Err(StoreError::SchemaTooNew { .. })
    ));
}

#[test]
fn reader_needs_a_migrated_database_and_sees_commits() {
    let db = Db::new();
    drop(Connection::open(db.path()).unwrap());
    assert!(matches!(
        EventReader::open(db.path()),
        Err(StoreError::SchemaTooOld { found: 0, .. })
    ));
    std::fs::remove_file(db.path()).unwrap();

    let mut store = db.open();
    let reader = EventReader::open(db.path()).unwrap();
    let none = reader.replay(0, 1, &only("s"), 10).unwrap();
    assert_eq!(none.lines, Vec::<String>::new());
    let event = store
        .register(req("s", owner(10)), NOW)
        .unwrap()
        .event
        .unwrap();
    let replayed = reader.replay(0, 1, &only("s"), 10).unwrap();
    let lines: Vec<StreamMessage> = (replayed.lines.iter())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines, [StreamMessage::Event(Box::new(event))]);
}

#[test]
fn end_many_finalizes_a_thousand_owners_in_one_transaction() {
    let db = Db::new();
    let mut store = db.open();
    for pid in 0..1000 {
        store
            .register(req(&format!("s{pid}"), owner(pid)), NOW)
            .unwrap();
    }
    // One of them moved on to a new owner before the burst arrives.
    store.register(req("s7", owner(5000)), NOW).unwrap();
    let deaths: Vec<_> = (0..1000)
        .map(|pid| OwnerDeath {
            owner: owner(pid),
            reason: EndReason::OwnerExited,
            exit: Some(ExitStatus::Signaled {
                signal: 9,
                core_dumped: false,
            }),
            detected_by: DetectedBy::Ebpf,
            observed_ms: NOW,
            died_ms: None,
            survivors: None,
            cause: None,
            usage: None,
            sender_root: None,
            tree_cgroups: Default::default(),
        })
        .collect();
    let start = std::time::Instant::now();
    let ended = store.end_many(&deaths, NOW + 1).unwrap();
    eprintln!("end_many of 1000 owners: {:?}", start.elapsed());

    assert_eq!(ended.len(), 999);
    assert!(ended.iter().all(|e| e.session != "s7"));
    let seqs: Vec<u64> = ended.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1002..=2000).collect::<Vec<_>>());
    assert_eq!(store.head_seq().unwrap(), 2000);
    assert_eq!(store.active_owners().unwrap(), [owner(5000)]);
    assert!(store.end_many(&deaths, NOW + 2).unwrap().is_empty());
}

#[test]
fn stored_body_round_trips_to_the_returned_event() {
    let db = Db::new();
    let mut store = db.open();
    let mut returned = vec![
        store
            .register(pending("p", owner(10), NOW + 9), NOW)
            .unwrap()
            .event
            .unwrap(),
    ];
    returned.push(
        store
            .register(req("p", owner(11)), NOW)
            .unwrap()
            .event
            .unwrap(),
    );
    returned.push(store.rename(UID, "p", "real", NOW).unwrap());
    returned.extend(end_owner(
        &mut store,
        &owner(11),
        Some(ExitStatus::Signaled {
            signal: 11,
            core_dumped: true,
        }),
        DetectedBy::Ebpf,
        NOW - 1,
        NOW,
    ));
    let EventPage::Events(stored) = store.events_after(0, 10, &EventFilter::default()).unwrap()
    else {
        panic!("no gap expected");
    };
    assert_eq!(stored.len(), 4);
    for (stored, event) in stored.iter().zip(&returned) {
        assert_eq!(stored.body, serde_json::to_string(event).unwrap());
        assert_eq!(&serde_json::from_str::<Event>(&stored.body).unwrap(), event);
    }
    let registered: serde_json::Value = serde_json::from_str(&stored[0].body).unwrap();
    assert_eq!(registered["kind"], "session.registered");
    assert!(
        registered.get("reason").is_none(),
        "None fields are omitted"
    );
    let ended: serde_json::Value = serde_json::from_str(&stored[3].body).unwrap();
    assert_eq!(ended["kind"], "session.ended");
    assert_eq!(ended["reason"], "owner_exited");
    assert_eq!(ended["detected_by"], "ebpf");
    assert_eq!(ended["exit"]["kind"], "signaled");
    assert_eq!(ended["observed_ms"], NOW - 1);
}

#[test]
fn commits_survive_an_unclean_drop() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("s", owner(10)), NOW).unwrap();
    end_by_owner(&mut store, &owner(10));
    // No close, no checkpoint: the commits live only in the WAL.
    std::mem::forget(store);
    let store = db.open();
    assert_eq!(store.head_seq().unwrap(), 2);
    assert_eq!(store.get(UID, "s").unwrap().unwrap().phase, Phase::Ended);
}

/// The real thing: a child process commits, then SIGKILLs itself.
#[test]
fn commits_survive_sigkill() {
    const CHILD_DB: &str = "LIVENESS_STORE_TEST_CHILD_DB";
    if let Some(path) = std::env::var_os(CHILD_DB) {
        let mut store = Store::open(path).unwrap();
        store.register(req("s", owner(10)), NOW).unwrap();
        end_by_owner(&mut store, &owner(10));
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
            .unwrap();
        unreachable!("SIGKILL returned");
    }
    let db = Db::new();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::tests::commits_survive_sigkill",
            "--nocapture",
        ])
        .env(CHILD_DB, db.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let store = db.open();
    assert_eq!(store.head_seq().unwrap(), 2);
    assert_eq!(store.get(UID, "s").unwrap().unwrap().phase, Phase::Ended);
}

#[test]
fn the_cleanup_policy_is_stored_and_the_reaped_event_recorded() {
    let db = Db::new();
    let mut store = db.open();
    let terminating = NewSession {
        on_end: OnEnd::Terminate,
        grace_ms: 1500,
        ..req("s1", owner(10))
    };
    let registered = store.register(terminating, NOW).unwrap();
    assert_eq!(
        registered.event.map(|e| e.on_end),
        Some(OnEnd::Terminate),
        "the registered event names the policy"
    );
    let session = store.get(UID, "s1").unwrap().unwrap();
    assert_eq!((session.on_end, session.grace_ms), (OnEnd::Terminate, 1500));
    let mut ended = end_by_owner(&mut store, &owner(10));
    let ended = ended.pop().expect("the session ends");
    assert_eq!(ended.on_end, OnEnd::Terminate);

    let reaped = Reaped {
        terminated: vec![11],
        killed: vec![12],
        exited: vec![13],
        failed: vec![ReapFailure {
            pid: 14,
            reason: "refused".into(),
        }],
        resumed: false,
    };
    let about = |event: &Event| (event.session.clone(), event.reason, event.on_end);
    let due: Vec<_> = store.reaps_due().unwrap().iter().map(about).collect();
    assert_eq!(
        due,
        [about(&ended)],
        "the end marks the reap due, in its own transaction"
    );
    let done = [(ended.clone(), reaped.clone())];
    let [event] = &store.record_reaped(&done, NOW + 9).unwrap()[..] else {
        panic!("one session.reaped is recorded");
    };
    let event = event.clone();
    assert_eq!(store.reaps_due().unwrap(), [], "recording it ends the reap");
    assert_eq!(
        store.record_reaped(&done, NOW + 10).unwrap(),
        [],
        "a session's reap is recorded once, however often it ran"
    );
    assert_eq!(
        (event.seq, event.kind, event.at_ms),
        (ended.seq + 1, EventKind::Reaped, NOW + 9)
    );
    assert_eq!(event.reaped.as_ref(), Some(&reaped));
    assert_eq!((event.session.as_str(), event.creator_uid), ("s1", UID));
    let replayed = events(store.events_after(ended.seq, 10, &only("s1")).unwrap());
    assert_eq!(
        replayed,
        vec![event],
        "the stored event is the one published"
    );
    let session = store.get(UID, "s1").unwrap().unwrap();
    assert_eq!(
        (session.phase, session.reaped.as_ref()),
        (Phase::Ended, Some(&reaped)),
        "the session row keeps the outcome, for get"
    );
    drop(store);
    let reopened = db.open();
    assert_eq!(
        reopened.get(UID, "s1").unwrap().unwrap().reaped,
        Some(reaped.clone()),
        "the outcome reads back after a restart"
    );
    drop(reopened);
    // A damaged outcome is left out; the session still reads.
    Connection::open(db.path())
        .unwrap()
        .execute(
            "UPDATE sessions SET reaped = '{\"terminated\": [1' WHERE id = 's1'",
            [],
        )
        .unwrap();
    let mut store = db.open();
    let damaged = store.get(UID, "s1").unwrap().unwrap();
    assert_eq!((damaged.phase, damaged.reaped), (Phase::Ended, None));

    let plain = store.register(req("s2", owner(20)), NOW).unwrap().session;
    assert_eq!(
        (plain.on_end, plain.grace_ms),
        (OnEnd::Leave, DEFAULT_GRACE_MS)
    );
    let end = |store: &mut Store, id: &str, terminate: bool| {
        let owner = owner(20);
        store
            .end(
                UID,
                id,
                Some(&owner),
                &Ending {
                    terminate,
                    ..Ending::because(EndReason::Stopped)
                },
                NOW + 11,
            )
            .unwrap()
    };
    store.register(req("s3", owner(20)), NOW).unwrap();
    end(&mut store, "s3", false);
    assert_eq!(store.reaps_due().unwrap(), [], "leave: no reap is due");
    end(&mut store, "s2", true);
    let due: Vec<_> = store.reaps_due().unwrap().iter().map(about).collect();
    assert_eq!(
        due,
        [("s2".to_owned(), Some(EndReason::Stopped), OnEnd::Leave)],
        "an end that asks to terminate marks the reap due whatever the policy"
    );
}

fn granted(acquired: Acquired) -> (Lock, Event) {
    match acquired {
        Acquired::Granted { lock, event } => (lock, *event),
        other => panic!("the lock should be granted, got {other:?}"),
    }
}

fn acquire(store: &mut Store, session: &str, name: &str) -> Acquired {
    store.acquire_lock(UID, session, name, true, NOW).unwrap()
}

#[test]
fn a_lock_is_exclusive_and_its_tokens_only_grow() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    store.register(req("b", owner(11)), NOW).unwrap();
    let (first, event) = granted(acquire(&mut store, "a", "build"));
    assert_eq!(
        (
            event.kind,
            event.session.as_str(),
            event.lock.as_ref().map(|l| l.token)
        ),
        (EventKind::LockAcquired, "a", Some(first.token))
    );
    assert_eq!(
        acquire(&mut store, "a", "build"),
        Acquired::AlreadyHeld(first.clone()),
        "the holder asking again gets the same grant"
    );
    assert_eq!(
        acquire(&mut store, "b", "build"),
        Acquired::HeldByOther(first.clone())
    );
    let refused = store.release_lock(UID, "b", "build", NOW).unwrap_err();
    assert!(
        matches!(refused, StoreError::NotHeld { .. }),
        "only the holder releases: {refused}"
    );
    assert_eq!(store.lock(UID, "build").unwrap(), Some(first.clone()));

    let mut tokens = vec![first.token];
    let (_, released) = store.release_lock(UID, "a", "build", NOW).unwrap();
    assert_eq!(
        released.lock.as_ref().and_then(|l| l.reason),
        Some(ReleaseReason::Released)
    );
    tokens.push(granted(acquire(&mut store, "b", "build")).0.token);
    store.release_lock(UID, "b", "build", NOW).unwrap();
    // Another user's lock of the same name is another lock, and takes a token too.
    store
        .register(
            NewSession {
                creator_uid: 2000,
                ..req("a", owner(12))
            },
            NOW,
        )
        .unwrap();
    granted(store.acquire_lock(2000, "a", "build", true, NOW).unwrap());
    // Every session that held it ended and was pruned: the counter does not go back.
    end_by_owner(&mut store, &owner(10));
    end_by_owner(&mut store, &owner(11));
    assert_eq!(store.prune_sessions(NOW + 1_000).unwrap(), 2);
    drop(store);
    let mut store = db.open();
    store.register(req("c", owner(13)), NOW).unwrap();
    tokens.push(granted(acquire(&mut store, "c", "build")).0.token);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens strictly increase across releases, users, prunes and reopening: {tokens:?}"
    );
}

#[test]
fn every_ending_releases_the_sessions_locks_in_its_transaction() {
    let db = Db::new();
    let mut store = db.open();
    type EndWith = fn(&mut Store, &Identity) -> Vec<Event>;
    let endings: [(&str, u32, EndWith); 3] = [
        ("exited", 10, end_by_owner),
        ("stopped", 11, |store, _| {
            let stopped = store.end(
                UID,
                "stopped",
                None,
                &Ending::because(EndReason::Stopped),
                NOW,
            );
            stopped.unwrap()
        }),
        ("expired", 12, |store, owner| {
            let expired = store.end(
                UID,
                "expired",
                Some(owner),
                &Ending::because(EndReason::PendingExpired),
                NOW,
            );
            expired.unwrap()
        }),
    ];
    for (id, pid, end) in endings {
        store.register(pending(id, owner(pid), NOW), NOW).unwrap();
        for name in ["x", "y"] {
            granted(acquire(&mut store, id, &format!("{id}-{name}")));
        }
        let events = end(&mut store, &owner(pid));
        let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::Ended,
                EventKind::LockReleased,
                EventKind::LockReleased
            ],
            "{id}: the end and both releases come out of one commit"
        );
        for event in &events[1..] {
            let lock = event.lock.as_ref().expect("a lock event names its lock");
            assert_eq!(
                (event.session.as_str(), lock.reason),
                (id, Some(ReleaseReason::SessionEnded))
            );
            assert_eq!(store.lock(UID, &lock.name).unwrap(), None, "{id}: released");
        }
    }
    assert!(store.locks(None).unwrap().is_empty());
    let refused = store
        .acquire_lock(UID, "exited", "z", true, NOW)
        .unwrap_err();
    assert!(
        matches!(refused, StoreError::AlreadyEnded(_)),
        "an ended session takes no lock: {refused}"
    );
}

#[test]
fn a_renamed_pending_session_keeps_its_locks() {
    let db = Db::new();
    let mut store = db.open();
    store
        .register(pending("pending-1", owner(10), NOW + 1), NOW)
        .unwrap();
    let (lock, _) = granted(acquire(&mut store, "pending-1", "worktree"));
    store.rename(UID, "pending-1", "real", NOW).unwrap();
    assert_eq!(
        store.lock(UID, "worktree").unwrap(),
        Some(Lock {
            session: "real".into(),
            ..lock
        })
    );
    store.release_lock(UID, "real", "worktree", NOW).unwrap();
}

#[test]
fn bad_lock_requests_change_nothing() {
    let db = Db::new();
    let mut store = db.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    let head = store.head_seq().unwrap();
    for name in [
        "",
        "bad\nname",
        "zero\u{200B}width",
        &"n".repeat(MAX_ID_LEN + 1),
    ] {
        let refused = store.acquire_lock(UID, "a", name, true, NOW).unwrap_err();
        assert!(
            matches!(refused, StoreError::InvalidLockName(_)),
            "{name:?}: {refused}"
        );
    }
    let refused = store
        .acquire_lock(UID, "missing", "build", true, NOW)
        .unwrap_err();
    assert!(matches!(refused, StoreError::NotFound(_)), "{refused}");
    for i in 0..MAX_LOCKS_PER_SESSION {
        granted(acquire(&mut store, "a", &format!("l{i}")));
    }
    let head_full = store.head_seq().unwrap();
    let refused = store
        .acquire_lock(UID, "a", "one-more", true, NOW)
        .unwrap_err();
    assert!(matches!(refused, StoreError::TooManyLocks(_)), "{refused}");
    assert_eq!(
        store.head_seq().unwrap(),
        head_full,
        "no event for a refusal"
    );
    assert_eq!(head_full, head + MAX_LOCKS_PER_SESSION as u64);
    assert_eq!(store.locks(Some(UID)).unwrap().len(), MAX_LOCKS_PER_SESSION);
}

#[test]
fn tokens_jump_with_seqs_after_an_unclean_stop_on_another_boot() {
    let db = Db::new();
    let mut store = db.open();
    store.begin_run("boot-a").unwrap();
    store.register(req("a", owner(10)), NOW).unwrap();
    let (first, _) = granted(acquire(&mut store, "a", "build"));
    drop(store);
    let mut store = db.open();
    assert!(store.begin_run("boot-b").unwrap(), "maybe a power loss");
    store.release_lock(UID, "a", "build", NOW).unwrap();
    let (second, _) = granted(acquire(&mut store, "a", "build"));
    assert_eq!(second.token, first.token + 1 + SEQ_JUMP_AFTER_POWER_LOSS);
}

#[test]
fn recovery_keeps_the_locks_of_recovered_sessions_and_never_reuses_a_token() {
    let (old, new) = (Db::new(), Db::new());
    let mut store = old.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    let (held, _) = granted(acquire(&mut store, "a", "x"));
    // A lock whose session cannot be read back would have no end to release it.
    store
        .conn
        .execute(
            "INSERT INTO locks (uid, name, session, token, since_ms) VALUES (?1, 'ghost', 'gone', 99, 0)",
            [UID],
        )
        .unwrap();
    drop(store);
    let mut recovered = new.open();
    super::recovery::salvage(&old.path(), &mut recovered.conn);
    assert_eq!(recovered.locks(None).unwrap(), [held]);
    recovered.register(req("b", owner(11)), NOW).unwrap();
    let (next, _) = granted(recovered.acquire_lock(UID, "b", "y", true, NOW).unwrap());
    assert!(
        next.token > 99 + SEQ_JUMP_AFTER_POWER_LOSS,
        "tokens continue above every one that may have been handed out: {}",
        next.token
    );
}

#[test]
fn a_token_granted_after_the_state_was_deleted_or_restored_exceeds_every_earlier_one() {
    let (db, fresh) = (Db::new(), Db::new());
    let mut store = db.open();
    store.register(req("a", owner(10)), NOW).unwrap();
    let (first, _) = granted(acquire(&mut store, "a", "x"));
    drop(store);
    let older = std::fs::read(db.path()).unwrap();
    let mut store = db.open();
    // Many grants within the same millisecond run the counter ahead of the clock's floor.
    let mut last = first.token;
    for _ in 0..50 {
        store.release_lock(UID, "a", "x", NOW).unwrap();
        let (lock, _) = granted(acquire(&mut store, "a", "x"));
        assert!(lock.token > last);
        last = lock.token;
    }
    drop(store);
    std::fs::write(db.path(), older).unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.path().display()));
    }
    let later = NOW + 1;
    for (what, mut store) in [("restored", db.open()), ("deleted", fresh.open())] {
        if what == "deleted" {
            store.register(req("a", owner(10)), later).unwrap();
        } else {
            store.release_lock(UID, "a", "x", later).unwrap();
        }
        let (lock, _) = granted(store.acquire_lock(UID, "a", "x", true, later).unwrap());
        assert!(
            lock.token > last,
            "{what}: token {} after tokens up to {last}",
            lock.token
        );
    }
}

/// A death by SIGTERM from a member of session "builder"'s tree (rooted at owner 30),
/// whose owner has three sessions: its creator's, another user's, and root's.
fn killed_by_a_builder(store: &mut Store) -> OwnerDeath {
    use liveness_common::cause::{Cause, MembersUsage, Sender, Usage};
    let victim = owner(20);
    store.register(req("mine", victim.clone()), NOW).unwrap();
    for (id, creator_uid) in [("theirs", UID + 1), ("roots", 0)] {
        let session = NewSession {
            creator_uid,
            ..req(id, victim.clone())
        };
        store.register(session, NOW).unwrap();
    }
    store.register(req("builder", owner(30)), NOW).unwrap();
    OwnerDeath {
        owner: victim,
        reason: EndReason::OwnerExited,
        exit: Some(ExitStatus::Signaled {
            signal: 15,
            core_dumped: false,
        }),
        detected_by: DetectedBy::Ebpf,
        observed_ms: NOW,
        died_ms: None,
        survivors: None,
        cause: Some(Cause::Signal {
            signal: 15,
            sender: Some(Sender {
                pid: 31,
                start_ticks: 3,
                comm: "kill".into(),
                uid: UID,
                session: None,
            }),
            kernel: None,
        }),
        usage: Some(Usage {
            cpu_user_us: 300_000,
            cpu_system_us: 1_000,
            peak_rss_bytes: 1 << 20,
            members: MembersUsage::default(),
        }),
        sender_root: Some(owner(30).key()),
        tree_cgroups: Default::default(),
    }
}

/// The session a cause names as its sender's.
fn sender_session(cause: Option<&liveness_common::cause::Cause>) -> Option<String> {
    use liveness_common::cause::Cause;
    match cause {
        Some(Cause::Signal {
            sender: Some(sender),
            ..
        }) => sender.session.clone(),
        other => panic!("not a signal with a sender: {other:?}"),
    }
}

#[test]
fn causes_and_usage_are_stored_and_a_foreign_sender_session_is_not_named() {
    let db = Db::new();
    let mut store = db.open();
    let death = killed_by_a_builder(&mut store);
    let events = store
        .end_many(std::slice::from_ref(&death), NOW + 1)
        .unwrap();
    let by_session = |id: &str| events.iter().find(|e| e.session == id).unwrap();
    assert_eq!(
        sender_session(by_session("mine").cause.as_ref()),
        Some("builder".into())
    );
    assert_eq!(
        sender_session(by_session("theirs").cause.as_ref()),
        None,
        "another user's session id reached a non-root creator's ending"
    );
    assert_eq!(
        sender_session(by_session("roots").cause.as_ref()),
        Some("builder".into()),
        "root sees every session"
    );
    // Stored as published, and read back after a reopen.
    drop(store);
    let store = db.open();
    let mine = store.get(UID, "mine").unwrap().unwrap();
    assert_eq!(mine.cause, by_session("mine").cause);
    assert_eq!(mine.usage, death.usage);
    let theirs = store.get(UID + 1, "theirs").unwrap().unwrap();
    assert_eq!(sender_session(theirs.cause.as_ref()), None);
}

/// A daemon killed between a death's append and its commit applies the journal at its
/// next start: the causes and usage come back from the journal, not from the source.
#[test]
fn a_replayed_journal_entry_keeps_its_causes_and_usage() {
    let db = Db::new();
    let mut store = db.open();
    let death = killed_by_a_builder(&mut store);
    let active = super::Active::load(&store).unwrap();
    let batch =
        super::journal_deaths(&active, &[death], NOW + 1, store.head_seq().unwrap()).unwrap();
    // Through the journal's own encoding, as a start reads it back.
    let entry: super::journal::JournalEntry =
        serde_json::from_str(&serde_json::to_string(&batch.entry).unwrap()).unwrap();
    drop(store);
    let mut store = db.open();
    assert_eq!(store.get(UID, "mine").unwrap().unwrap().cause, None);
    assert_eq!(store.replay(&[entry]).unwrap(), 1);
    for published in &batch.events {
        if published.kind != EventKind::Ended {
            continue;
        }
        let stored = store
            .get(published.creator_uid, &published.session)
            .unwrap()
            .unwrap();
        assert_eq!(stored.cause, published.cause, "{}", published.session);
        assert_eq!(stored.usage, published.usage, "{}", published.session);
    }
    let stored = events(store.events_after(0, 100, &EventFilter::default()).unwrap());
    let ended: Vec<_> = stored
        .into_iter()
        .filter(|e| e.kind == EventKind::Ended)
        .collect();
    assert_eq!(ended.len(), 3);
    assert!(ended.iter().all(|e| e.usage.is_some() && e.cause.is_some()));
}

#[test]
fn endings_no_source_explained_say_what_is_known() {
    use liveness_common::cause::{Cause, CauseKind};
    let db = Db::new();
    let mut store = db.open();
    store.register(req("stopped", owner(40)), NOW).unwrap();
    let stopped = store
        .end(
            UID,
            "stopped",
            None,
            &Ending::because(EndReason::Stopped),
            NOW + 1,
        )
        .unwrap();
    assert_eq!(stopped[0].cause, Some(Cause::NoDeath));
    store.register(req("seen", owner(41)), NOW).unwrap();
    let seen = end_owner(
        &mut store,
        &owner(41),
        Some(ExitStatus::Signaled {
            signal: 9,
            core_dumped: false,
        }),
        DetectedBy::Pidfd,
        NOW,
        NOW + 1,
    );
    let cause = seen[0].cause.clone().unwrap();
    assert_eq!(cause.kind(), CauseKind::Unknown);
    assert!(cause.to_string().contains("pidfd"), "{cause}");
}

fn with_actions(id: &str, owner: Identity, count: usize) -> NewSession {
    let specs = (0..count)
        .map(|i| liveness_common::action::ActionSpec::new(["echo", &i.to_string()]))
        .collect();
    NewSession {
        on_end_run: Some(specs),
        on_stall: None,
        cgroup: None,
        creator_gid: Some(4242),
        ..req(id, owner)
    }
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|event| event.kind).collect()
}

#[test]
fn end_actions_are_due_once_their_session_ends_and_recorded_once() {
    use liveness_common::action::{ActionOutcome, Skipped};
    use liveness_common::session::ActionPhase;
    let db = Db::new();
    let mut store = db.open();
    let registered = store
        .register(with_actions("s", owner(10), 2), NOW)
        .unwrap();
    assert_eq!(
        registered.event.unwrap().actions,
        2,
        "the event counts them"
    );
    assert_eq!(store.actions_due(None).unwrap(), [], "not before the end");
    let ended = end_by_owner(&mut store, &owner(10));
    assert_eq!(
        ended[0].actions, 2,
        "the ended event says a finalized follows"
    );
    let due = store.actions_due(None).unwrap();
    assert_eq!(due.len(), 2);
    assert_eq!(
        (due[0].gid, due[0].resumed, due[0].root),
        (Some(4242), false, None)
    );

    let key = due[0].key.clone();
    let Begin::Run(session) = store.run_action(&key).unwrap() else {
        panic!("a pending action runs");
    };
    assert_eq!(session.on_end_run.len(), 2);
    let root = ProcessKey {
        pid: 77,
        start_ticks: 5,
    };
    store.action_spawned(&key, root).unwrap();
    let again = store.actions_due(Some((UID, "s"))).unwrap();
    assert_eq!(
        (again[0].resumed, again[0].root),
        (true, Some(root)),
        "a restart resumes it"
    );

    let outcome = ActionOutcome {
        index: 0,
        exit: exited(0),
        ..ActionOutcome::default()
    };
    let events = store
        .record_actions(&[(key.clone(), outcome.clone())], NOW + 9)
        .unwrap();
    assert_eq!(kinds(&events), [EventKind::Action]);
    assert_eq!(events[0].action.as_ref(), Some(&outcome));
    let twice = store
        .record_actions(&[(key.clone(), outcome)], NOW + 9)
        .unwrap();
    assert_eq!(twice, [], "an outcome is recorded once");
    assert_eq!(
        store.run_action(&key).unwrap(),
        Begin::Skip,
        "and never runs again"
    );

    let (skipped, running) = store.skip_actions(UID, "s", NOW + 10).unwrap();
    assert_eq!(kinds(&skipped), [EventKind::Action, EventKind::Finalized]);
    assert_eq!(running, 0);
    assert_eq!(
        skipped[0].action.as_ref().and_then(|o| o.skipped),
        Some(Skipped::DoneByAgent)
    );
    assert_eq!(store.actions_due(None).unwrap(), []);
    let session = store.get(UID, "s").unwrap().unwrap();
    assert_eq!(session.finalized_ms, Some(NOW + 10));
    assert!(session.is_finalized());
    let states = store.action_states(UID, "s").unwrap();
    assert!(
        states
            .iter()
            .all(|s| s.state == ActionPhase::Done && s.outcome.is_some())
    );
    assert_eq!(
        store.finalize_if_done(UID, "s", NOW + 11).unwrap(),
        None,
        "once"
    );
}

#[test]
fn actions_follow_renames_and_a_new_list_replaces_the_old() {
    let db = Db::new();
    let mut store = db.open();
    store
        .register(
            NewSession {
                pending: true,
                pending_expires_ms: Some(NOW + 1000),
                ..with_actions("pending-1", owner(10), 3)
            },
            NOW,
        )
        .unwrap();
    store.rename(UID, "pending-1", "real", NOW + 1).unwrap();
    assert_eq!(store.action_states(UID, "real").unwrap().len(), 3);
    // The same owner again, with one action: the list is replaced; without: kept.
    store
        .register(with_actions("real", owner(10), 1), NOW + 2)
        .unwrap();
    store.register(req("real", owner(10)), NOW + 3).unwrap();
    let session = store.get(UID, "real").unwrap().unwrap();
    assert_eq!(session.on_end_run.len(), 1);
    assert_eq!(store.action_states(UID, "real").unwrap().len(), 1);
    // Skipped before the end: the end itself has nothing left to run.
    let (events, _) = store.skip_actions(UID, "real", NOW + 4).unwrap();
    assert_eq!(
        kinds(&events),
        [EventKind::Action],
        "not final before the end"
    );
    end_by_owner(&mut store, &owner(10));
    assert_eq!(store.actions_due(Some((UID, "real"))).unwrap(), []);
    let finalized = store.finalize_if_done(UID, "real", NOW + 7).unwrap();
    assert_eq!(finalized.map(|e| e.kind), Some(EventKind::Finalized));
}

/// What an agent declared and a stall episode are kept with the session across a reopen,
/// the episode cleared by its end; a damaged value of either reads as absent, and the
/// session still reads.
#[test]
fn declarations_and_stall_episodes_are_kept_and_damage_reads_as_absent() {
    use liveness_common::activity::{Activity, ActivityState, Declared, Evidence, TurnMark};
    let db = Db::new();
    let mut store = db.open();
    store.register(req("s1", owner(10)), NOW).unwrap();
    let declared = Declared::default().declare(Some(TurnMark::Start), Some("Bash"), false, NOW);
    store.touch(UID, "s1", NOW + 1, Some(&declared)).unwrap();
    let stalled = Activity {
        state: ActivityState::Stalled,
        reason: None,
        since_ms: NOW,
        evidence: Evidence::default(),
    };
    let event = store.record_activity(UID, "s1", &stalled, NOW + 2).unwrap();
    assert_eq!(event.map(|e| e.kind), Some(EventKind::Stalled));
    drop(store);
    let mut store = db.open();
    let session = store.get(UID, "s1").unwrap().unwrap();
    assert_eq!(
        (session.declared.as_ref(), session.activity.as_ref()),
        (Some(&declared), Some(&stalled))
    );
    let working = Activity {
        state: ActivityState::Working,
        ..stalled.clone()
    };
    let event = store.record_activity(UID, "s1", &working, NOW + 3).unwrap();
    assert_eq!(event.map(|e| e.kind), Some(EventKind::Unstalled));
    assert_eq!(store.get(UID, "s1").unwrap().unwrap().activity, None);
    store.record_activity(UID, "s1", &stalled, NOW + 4).unwrap();
    drop(store);
    Connection::open(db.path())
        .unwrap()
        .execute(
            "UPDATE sessions SET declared = '{\"at_ms\": ', activity = '[' WHERE id = 's1'",
            [],
        )
        .unwrap();
    let damaged = db.open().get(UID, "s1").unwrap().unwrap();
    assert_eq!(
        (damaged.phase, damaged.declared, damaged.activity),
        (Phase::Active, None, None)
    );
}

/// A death's `session.ended` JSON is written between pieces prepared when its session
/// became ACTIVE: byte for byte what serde writes of the event, whatever the session holds
/// (strings to escape, no labels, a policy, end actions) and whatever the death knows.
#[test]
fn a_prepared_ended_event_is_what_serde_writes_of_it() {
    use liveness_common::session::Survivors;
    let db = Db::new();
    let mut store = db.open();
    let death = killed_by_a_builder(&mut store);
    let victim = death.owner.clone();
    let escapes = NewSession {
        labels: BTreeMap::from([
            ("quote\"back\\slash".into(), "é ✓ </script>".into()),
            ("empty".into(), String::new()),
        ]),
        on_end: OnEnd::Terminate,
        ..with_actions("a \"quoted\" \\ id é", victim.clone(), 2)
    };
    store.register(escapes, NOW).unwrap();
    let bare = NewSession {
        labels: BTreeMap::new(),
        until: Until::Tree,
        ..req("bare", victim.clone())
    };
    store.register(bare, NOW).unwrap();
    let mut died_with_a_tree = death.clone();
    died_with_a_tree.died_ms = Some(NOW - 1);
    died_with_a_tree.survivors = Some(Survivors::from_alive(vec![owner(21), owner(22)]));
    for death in [death, died_with_a_tree] {
        let active = super::Active::load(&store).unwrap();
        let batch = super::journal_deaths(&active, &[death], NOW + 1, 7).unwrap();
        let ended = batch.events.iter().filter(|e| e.kind == EventKind::Ended);
        // Until its tree has exited, `bare` outlives an owner that left survivors.
        assert!(ended.count() >= 4, "{:?}", kinds(&batch.events));
        for (event, journaled) in batch.events.iter().zip(&batch.entry.events) {
            assert_eq!(
                journaled.body.as_str(),
                serde_json::to_string(event).unwrap(),
                "{}",
                event.session
            );
        }
    }
}

/// An escape of a live session's process is recorded once with its `session.escaped`, and
/// the end's escapes are stored beside it, the same process not twice, with what the
/// cgroup held besides the survivors; a session without a cgroup records none.
#[test]
fn an_escape_is_recorded_once_and_the_ends_escapes_join_it() {
    use liveness_common::identity::ProcessKey;
    use liveness_common::session::{CgroupEscape, CgroupUsage, SessionCgroup, Unlisted};
    let db = Db::new();
    let mut store = db.open();
    let cgroup = SessionCgroup {
        path: "/sys/fs/cgroup/liveness.slice/s1000-1-10".into(),
        memory_max: None,
        tasks_max: None,
        memory_high: None,
        cpu_weight: None,
        on_oom: None,
        usage: None,
        escaped: Vec::new(),
        unlisted: None,
    };
    let with_cgroup = NewSession {
        cgroup: Some(cgroup),
        ..req("s1", owner(10))
    };
    store.register(with_cgroup, NOW).unwrap();
    store.register(req("plain", owner(11)), NOW).unwrap();
    let moved = CgroupEscape {
        pid: 20,
        start_ticks: 7,
        cgroup: "/elsewhere".into(),
    };
    let event = store
        .record_escape(UID, "s1", &moved, NOW + 1)
        .unwrap()
        .unwrap();
    assert_eq!(
        (event.kind, event.escape.as_ref()),
        (EventKind::Escaped, Some(&moved))
    );
    assert_eq!(
        store.record_escape(UID, "s1", &moved, NOW + 2).unwrap(),
        None
    );
    assert_eq!(
        store.record_escape(UID, "plain", &moved, NOW + 2).unwrap(),
        None
    );
    let at_end = CgroupEscape {
        pid: 21,
        start_ticks: 8,
        cgroup: "/further".into(),
    };
    let found = [moved.clone(), at_end.clone()];
    let unlisted = Unlisted {
        total: 2,
        processes: vec![ProcessKey {
            pid: 30,
            start_ticks: 9,
        }],
    };
    store
        .cgroup_usage(UID, "s1", &CgroupUsage::default(), &found, Some(&unlisted))
        .unwrap();
    let stored = store.get(UID, "s1").unwrap().unwrap().cgroup.unwrap();
    assert_eq!(stored.escaped, [moved, at_end]);
    assert_eq!(stored.unlisted, Some(unlisted));
}
