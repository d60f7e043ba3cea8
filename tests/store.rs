//! The marker store against real files: hostile inputs, racing claimers, killed writers and the
//! sweep, and the probe's first contract (its two tests at the end).

use crate::common;

use chrono::{TimeDelta, Utc};
use common::*;
use planned_stop::marker::{Judgement, Marker, MarkerStore, StoreError, SweepReport};
use planned_stop::{Layout, ProcessIdentity};
use std::fs;
use std::io::{BufRead, BufReader};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[path = "helpers/store_shared.rs"]
mod store_shared;
use store_shared::{ROUNDS, claim_all, round_identity, slots_store};

// ---------------------------------------------------------------------------------------------
// Hostile inputs.
// ---------------------------------------------------------------------------------------------

enum Setup {
    Bytes(Vec<u8>),
    /// A symlink at the slot pointing at a valid marker for us elsewhere.
    SymlinkToOwnMarker,
    DanglingSymlink,
    Directory,
    Fifo,
    /// A valid marker for us, mode 000 (only meaningful when not running as root).
    Unreadable,
}

struct Case {
    name: &'static str,
    setup: Setup,
    /// `Judgement::kind()`, or "undecided".
    expect: &'static str,
}

fn json(s: String) -> Setup {
    Setup::Bytes(s.into_bytes())
}

/// What the hostile cases are written around: this process, a moment shortly after its start,
/// and a valid marker for it.
struct Around<'a> {
    me: &'a ProcessIdentity,
    now: chrono::DateTime<Utc>,
    ts: String,
    valid: String,
}

impl Around<'_> {
    /// A marker for this process with `fields` after its pid and fingerprint.
    fn with(&self, fields: &str) -> String {
        let (pid, start) = (self.me.pid, self.me.start);
        format!(r#"{{"target_pid":{pid},"target_start_time":{start},{fields}}}"#)
    }

    /// A marker for this process written at `t`.
    fn at(&self, t: chrono::DateTime<Utc>) -> String {
        self.with(&format!(r#""written_at":"{}""#, t.to_rfc3339()))
    }
}

fn case(name: &'static str, setup: Setup, expect: &'static str) -> Case {
    Case {
        name,
        setup,
        expect,
    }
}

fn hostile_cases(me: &ProcessIdentity) -> Vec<Case> {
    let now = shortly_after_start(me);
    let around = Around {
        me,
        now,
        ts: now.to_rfc3339(),
        valid: String::from_utf8(self_marker(me, now)).unwrap(),
    };
    [
        shape_cases(&around),
        pid_cases(&around),
        time_cases(&around),
        field_cases(&around),
        byte_cases(&around),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Markers of the wrong shape: not JSON, not an object, too big or too deep.
fn shape_cases(a: &Around) -> Vec<Case> {
    let ts = &a.ts;
    let valid = &a.valid;
    let with = |fields: &str| a.with(fields);
    vec![
        case("valid marker for us", json(valid.clone()), "for_self"),
        case(
            "garbage bytes",
            Setup::Bytes(b"\x00\x01\x02garbage\xfe".to_vec()),
            "malformed",
        ),
        case(
            "BOM then a valid marker",
            Setup::Bytes([&b"\xEF\xBB\xBF"[..], valid.as_bytes()].concat()),
            "for_self",
        ),
        case(
            "BOM only",
            Setup::Bytes(b"\xEF\xBB\xBF".to_vec()),
            "malformed",
        ),
        case("empty file", Setup::Bytes(Vec::new()), "malformed"),
        case("white space only", json(" \n\t ".into()), "malformed"),
        case("{}", json("{}".into()), "malformed"),
        case("JSON array", json("[]".into()), "malformed"),
        case(
            "array holding a marker",
            json(format!("[{valid}]")),
            "malformed",
        ),
        case("JSON string", json("\"stop\"".into()), "malformed"),
        case("JSON null", json("null".into()), "malformed"),
        case("1 MiB file", Setup::Bytes(vec![b' '; 1 << 20]), "malformed"),
        case(
            "valid marker padded past 4 KiB",
            json(format!("{valid}{}", " ".repeat(4096))),
            "malformed",
        ),
        case(
            "deep nesting",
            json(format!("{}{}", "[".repeat(100_000), "]".repeat(100_000))),
            "malformed",
        ),
        case(
            "deep nesting in an unknown key",
            json(with(&format!(
                r#""written_at":"{ts}","x":{}1{}"#,
                "[".repeat(64),
                "]".repeat(64)
            ))),
            "malformed",
        ),
    ]
}

/// A target pid of the wrong kind, a field given twice, a field missing.
fn pid_cases(a: &Around) -> Vec<Case> {
    let pid = a.me.pid;
    let start = a.me.start;
    let ts = &a.ts;
    let with = |fields: &str| a.with(fields);
    vec![
        case(
            "NaN pid",
            json(format!(r#"{{"target_pid":NaN,"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "1e999 pid",
            json(format!(r#"{{"target_pid":1e999,"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "bool pid",
            json(format!(r#"{{"target_pid":true,"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "float pid",
            json(format!(
                r#"{{"target_pid":{pid}.0,"target_start_time":{start},"written_at":"{ts}"}}"#
            )),
            "malformed",
        ),
        case(
            "string pid",
            json(format!(
                r#"{{"target_pid":"{pid}","target_start_time":{start},"written_at":"{ts}"}}"#
            )),
            "malformed",
        ),
        case(
            "negative pid",
            json(format!(r#"{{"target_pid":-{pid},"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "zero pid",
            json(format!(r#"{{"target_pid":0,"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "pid above u32",
            json(format!(
                r#"{{"target_pid":{},"written_at":"{ts}"}}"#,
                u64::from(u32::MAX) + u64::from(pid)
            )),
            "malformed",
        ),
        case(
            "duplicate target_pid",
            json(format!(
                r#"{{"target_pid":1,"target_pid":{pid},"target_start_time":{start},"written_at":"{ts}"}}"#
            )),
            "malformed",
        ),
        case(
            "duplicate written_at",
            json(with(&format!(
                r#""written_at":"2000-01-01T00:00:00Z","written_at":"{ts}""#
            ))),
            "malformed",
        ),
        case(
            "missing target_pid",
            json(format!(r#"{{"written_at":"{ts}"}}"#)),
            "malformed",
        ),
        case(
            "missing written_at",
            json(with(r#""stopper_pid":1"#)),
            "malformed",
        ),
    ]
}

/// When the marker was written, and for which life of this pid.
fn time_cases(a: &Around) -> Vec<Case> {
    let pid = a.me.pid;
    let start = a.me.start;
    let now = a.now;
    let ts = &a.ts;
    let me = a.me;
    let with = |fields: &str| a.with(fields);
    let at = |t| a.at(t);
    vec![
        case(
            "naive timestamp",
            json(with(&format!(r#""written_at":"{}""#, now.naive_utc()))),
            "malformed",
        ),
        case(
            "unparsable timestamp",
            json(with(r#""written_at":"soon""#)),
            "malformed",
        ),
        case(
            "numeric timestamp",
            json(with(&format!(r#""written_at":{}"#, now.timestamp()))),
            "malformed",
        ),
        case(
            "future timestamp",
            json(at(now + TimeDelta::hours(1))),
            "stale",
        ),
        case(
            "year 9999",
            json(at("9999-12-31T23:59:59Z".parse().unwrap())),
            "stale",
        ),
        case(
            "ancient timestamp",
            json(at("2000-01-01T00:00:00Z".parse().unwrap())),
            "stale",
        ),
        case(
            "offset timestamp",
            json(with(&format!(
                r#""written_at":"{}""#,
                now.with_timezone(&chrono::FixedOffset::east_opt(19800).unwrap())
                    .to_rfc3339()
            ))),
            "for_self",
        ),
        case(
            "written before our start, no fingerprint",
            json(format!(
                r#"{{"target_pid":{pid},"target_start_time":null,"written_at":"{}"}}"#,
                (me.started_at - TimeDelta::seconds(10)).to_rfc3339()
            )),
            "stale",
        ),
        case(
            "written before our start, our fingerprint",
            json(at(me.started_at - TimeDelta::seconds(10))),
            "stale",
        ),
        case(
            "another fingerprint",
            json(format!(
                r#"{{"target_pid":{pid},"target_start_time":{},"written_at":"{ts}"}}"#,
                start + 1
            )),
            "stale",
        ),
        case(
            "null fingerprint, written after our start",
            json(format!(
                r#"{{"target_pid":{pid},"target_start_time":null,"written_at":"{ts}"}}"#
            )),
            "for_self",
        ),
    ]
}

/// The other fields: the fingerprint's type, the version, unknown keys, the optional fields.
fn field_cases(a: &Around) -> Vec<Case> {
    let pid = a.me.pid;
    let start = a.me.start;
    let ts = &a.ts;
    let with = |fields: &str| a.with(fields);
    vec![
        case(
            "negative fingerprint",
            json(format!(
                r#"{{"target_pid":{pid},"target_start_time":-1,"written_at":"{ts}"}}"#
            )),
            "malformed",
        ),
        case(
            "float fingerprint",
            json(format!(
                r#"{{"target_pid":{pid},"target_start_time":{start}.5,"written_at":"{ts}"}}"#
            )),
            "malformed",
        ),
        case(
            "unknown version",
            json(with(&format!(r#""version":2,"written_at":"{ts}""#))),
            "malformed",
        ),
        case(
            "string version",
            json(with(&format!(r#""version":"1","written_at":"{ts}""#))),
            "malformed",
        ),
        case(
            "explicit version 1",
            json(with(&format!(r#""version":1,"written_at":"{ts}""#))),
            "for_self",
        ),
        case(
            "unknown keys",
            json(with(&format!(
                r#""written_at":"{ts}","colour":"blue","extra":{{"a":[1,2]}}"#
            ))),
            "for_self",
        ),
        case(
            "string trigger_watcher",
            json(with(&format!(
                r#""written_at":"{ts}","trigger_watcher":"false""#
            ))),
            "malformed",
        ),
        case(
            "request id too long",
            json(with(&format!(
                r#""written_at":"{ts}","request_id":"{}""#,
                "r".repeat(65)
            ))),
            "malformed",
        ),
        case(
            "control character in reason",
            json(with(&format!(r#""written_at":"{ts}","reason":"a\u001bb""#))),
            "malformed",
        ),
    ]
}

/// Bytes around a valid marker, another process's marker, and what is not a file at the slot.
fn byte_cases(a: &Around) -> Vec<Case> {
    let pid = a.me.pid;
    let start = a.me.start;
    let ts = &a.ts;
    let valid = &a.valid;
    vec![
        case(
            "trailing garbage",
            json(format!("{valid} trailing")),
            "malformed",
        ),
        case("two objects", json(format!("{valid}{valid}")), "malformed"),
        case(
            "invalid UTF-8 in a string",
            Setup::Bytes(
                [
                    &valid.as_bytes()[..valid.len() - 1],
                    b",\"reason\":\"\xff\xfe\"}",
                ]
                .concat(),
            ),
            "malformed",
        ),
        case(
            "UTF-16 marker",
            Setup::Bytes(valid.encode_utf16().flat_map(u16::to_le_bytes).collect()),
            "malformed",
        ),
        case(
            "NUL in the middle",
            Setup::Bytes([valid.as_bytes(), b"\0"].concat()),
            "malformed",
        ),
        case(
            "foreign pid",
            json(format!(
                r#"{{"target_pid":{},"target_start_time":{start},"written_at":"{ts}"}}"#,
                pid + 1
            )),
            "foreign",
        ),
        case(
            "symlink at the slot",
            Setup::SymlinkToOwnMarker,
            "malformed",
        ),
        case(
            "dangling symlink at the slot",
            Setup::DanglingSymlink,
            "malformed",
        ),
        case("directory at the slot", Setup::Directory, "malformed"),
        case("FIFO at the slot", Setup::Fifo, "malformed"),
        case("unreadable file", Setup::Unreadable, "undecided"),
    ]
}

/// Whether root runs the tests (root reads a mode-000 file, so "unreadable" cannot be staged).
fn running_as_root() -> bool {
    #[cfg(unix)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    return unsafe { libc::geteuid() == 0 };
    #[cfg(not(unix))]
    return false;
}

/// Puts `setup` at `slot`. Returns `None` when this OS cannot stage it (symlinks, FIFOs and
/// permission bits on Windows), else `Some` of the file a symlink points at, if any.
fn plant(
    setup: &Setup,
    slot: &Path,
    outside: &Path,
    me: &ProcessIdentity,
) -> Option<Option<PathBuf>> {
    match setup {
        Setup::Bytes(b) => fs::write(slot, b).unwrap(),
        Setup::Directory => fs::create_dir(slot).unwrap(),
        #[cfg(unix)]
        Setup::SymlinkToOwnMarker => {
            let target = outside.join("victim.json");
            fs::write(&target, self_marker(me, shortly_after_start(me))).unwrap();
            std::os::unix::fs::symlink(&target, slot).unwrap();
            return Some(Some(target));
        }
        #[cfg(unix)]
        Setup::DanglingSymlink => {
            std::os::unix::fs::symlink(outside.join("nowhere"), slot).unwrap()
        }
        #[cfg(unix)]
        Setup::Fifo => {
            let c = std::ffi::CString::new(slot.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        #[cfg(unix)]
        Setup::Unreadable => {
            use std::os::unix::fs::PermissionsExt;
            fs::write(slot, self_marker(me, shortly_after_start(me))).unwrap();
            fs::set_permissions(slot, fs::Permissions::from_mode(0o000)).unwrap();
        }
        #[cfg(not(unix))]
        _ => {
            let _ = (outside, me);
            return None;
        }
    }
    Some(None)
}

#[test]
fn hostile_slots_reach_the_designed_verdict_without_following_or_blocking() {
    // Run the table on another thread so a probe that blocks (say, on a FIFO) fails the test
    // instead of hanging it.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        run_hostile_table();
        done.send(()).unwrap();
    });
    match finished.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("a probe blocked"),
        Err(e) => panic!("the hostile table panicked: {e}"),
    }
}

fn run_hostile_table() {
    let me = ProcessIdentity::current().unwrap();
    let cases = hostile_cases(&me);
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut ran = 0;
    for case in cases {
        if matches!(case.setup, Setup::Unreadable) && running_as_root() {
            // Root reads a mode-000 file; the store's unit test covers a real read error.
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let store = slots_store(dir.path());
        let slot = store.slot_path(me.pid);
        let Some(victim) = plant(&case.setup, &slot, outside.path(), &me) else {
            continue;
        };
        ran += 1;
        let victim_before = victim.as_ref().map(|v| fs::read(v).unwrap());

        let now = shortly_after_start(&me);
        let inspected = store.inspect(me.pid, now);
        let probed = store.probe(&me, now);
        let got = match &probed {
            Ok(v) => v.kind(),
            Err(StoreError::Unreadable { .. }) => "undecided",
            Err(e) => panic!("{}: unexpected error {e}", case.name),
        };
        assert_eq!(got, case.expect, "{}: {probed:?}", case.name);
        assert_eq!(
            inspected
                .as_ref()
                .map(Judgement::kind)
                .unwrap_or("undecided"),
            case.expect,
            "{}: inspect and probe must agree",
            case.name
        );
        let still_there = fs::symlink_metadata(&slot).is_ok();
        let should_remain = matches!(case.expect, "for_self" | "foreign" | "undecided");
        assert_eq!(
            still_there, should_remain,
            "{}: slot present afterwards",
            case.name
        );
        if let (Some(v), Some(before)) = (victim, victim_before) {
            assert_eq!(
                fs::read(&v).unwrap(),
                before,
                "{}: the symlink target was touched",
                case.name
            );
        }
        // A claim never takes anything a probe would not fire on.
        let claimed = store.claim(&me, now);
        assert_eq!(
            matches!(claimed, Ok(Some(_))),
            case.expect == "for_self",
            "{}: claim {claimed:?}",
            case.name
        );
    }
    assert!(ran >= 40, "only {ran} cases could be staged on this OS");
}

#[test]
fn a_foreign_marker_in_the_shared_file_is_left_and_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("planned-stop.json");
    let store = MarkerStore::open(Layout::SingleFile(path.clone())).unwrap();
    let me = ProcessIdentity::current().unwrap();
    // A live other process: our child.
    let mut child = other_live_process();
    let other = ProcessIdentity::of(child.id()).unwrap();
    let pending = Marker::new(other.pid, Some(other.start), Utc::now());
    store.write(&pending).unwrap();

    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::Foreign(_)
    ));
    assert_eq!(store.claim(&me, Utc::now()).unwrap(), None);
    let ours = Marker::new(me.pid, Some(me.start), Utc::now());
    let refused = store.write(&ours);
    child.kill().unwrap();
    child.wait().unwrap();
    let expected_expiry = pending.written_at + chrono::TimeDelta::seconds(60);
    assert!(
        matches!(&refused, Err(StoreError::SlotBusy { pid, expires_at, .. })
            if *pid == other.pid && *expires_at == expected_expiry),
        "{refused:?}"
    );
    // The refusal says until when, and how to clear it, in words (the command line adds its own
    // flag where it reports this).
    let message = refused.unwrap_err().to_string();
    assert!(message.contains(&expected_expiry.to_string()), "{message}");
    assert!(message.contains("remove it"), "{message}");
    assert_eq!(Marker::parse(&fs::read(&path).unwrap()).unwrap(), pending);
    // Once that process is gone its marker no longer blocks the file.
    store.write(&ours).unwrap();
    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::ForSelf(_)
    ));
}

// ---------------------------------------------------------------------------------------------
// Writing.
// ---------------------------------------------------------------------------------------------

#[cfg(unix)]
#[test]
fn write_replaces_a_symlink_at_the_slot_and_never_writes_through_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("passwd");
    fs::write(&victim, "root:x:0:0\n").unwrap();
    let store = slots_store(dir.path());
    let me = ProcessIdentity::current().unwrap();
    let slot = store.slot_path(me.pid);
    std::os::unix::fs::symlink(&victim, &slot).unwrap();

    let marker = Marker::new(me.pid, Some(me.start), Utc::now());
    assert_eq!(store.write(&marker).unwrap(), slot);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root:x:0:0\n");
    let meta = fs::symlink_metadata(&slot).unwrap();
    assert!(meta.file_type().is_file(), "the slot is now a regular file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(Marker::parse(&fs::read(&slot).unwrap()).unwrap(), marker);
}

#[cfg(unix)]
#[test]
fn a_missing_directory_is_created_private_and_a_shared_one_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("a/b");
    slots_store(&dir);
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    let shared = base.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let err = MarkerStore::open(Layout::Slots(shared.clone())).unwrap_err();
    assert!(
        matches!(err, StoreError::SharedDirectory { mode: 0o777, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("chmod 700"),
        "the error says what to do: {err}"
    );
    let single = MarkerStore::open(Layout::SingleFile(shared.join("m.json")));
    assert!(matches!(single, Err(StoreError::SharedDirectory { .. })));
    MarkerStore::builder(Layout::Slots(shared))
        .allow_shared_dir(true)
        .open()
        .unwrap();

    let file = base.path().join("file");
    fs::write(&file, "").unwrap();
    assert!(matches!(
        MarkerStore::open(Layout::Slots(file)),
        Err(StoreError::Directory { .. } | StoreError::NotADirectory(_))
    ));
}

#[test]
fn an_invalid_marker_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    let bad = Marker::new(7, None, Utc::now()).with_request_id("x".repeat(100));
    assert!(matches!(
        store.write(&bad),
        Err(StoreError::InvalidMarker(_))
    ));
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}

#[test]
fn killed_writer_never_leaves_a_partial_slot() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    for round in 0..20u64 {
        let mut child = spawn_helper_program("marker_processes", &["writer"], dir.path());
        let mut out = BufReader::new(child.stdout.take().unwrap());
        wait_for_line(&mut out, "started");
        // Vary the moment of the kill across rounds.
        std::thread::sleep(Duration::from_micros(round * 397 % 5000));
        child.kill().unwrap();
        child.wait().unwrap();
        let bytes = fs::read(store.slot_path(4242)).unwrap();
        let marker = Marker::parse(&bytes).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(marker.target_pid, 4242);
    }
}

// ---------------------------------------------------------------------------------------------
// Claiming.
// ---------------------------------------------------------------------------------------------

fn write_round_markers(store: &MarkerStore) {
    for round in 0..ROUNDS {
        let id = round_identity(round);
        store
            .write(&Marker::new(id.pid, Some(id.start), Utc::now()))
            .unwrap();
    }
}

fn assert_exactly_one_winner(a: &[u32], b: &[u32]) {
    for round in 0..ROUNDS {
        let wins = a.contains(&round) as u32 + b.contains(&round) as u32;
        assert_eq!(wins, 1, "round {round} had {wins} winners");
    }
}

#[test]
fn two_threads_claiming_one_marker_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    write_round_markers(&store);
    let barrier = Arc::new(Barrier::new(2));
    let claimers: Vec<_> = (0..2)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            std::thread::spawn(move || {
                claim_all(&store, || {
                    barrier.wait();
                })
            })
        })
        .collect();
    let won: Vec<Vec<u32>> = claimers.into_iter().map(|t| t.join().unwrap()).collect();
    assert_exactly_one_winner(&won[0], &won[1]);
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "every marker consumed, nothing left over"
    );
}

#[test]
fn two_processes_claiming_one_marker_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(&dir.path().join("slots"));
    write_round_markers(&store);
    let mut children: Vec<_> = (0..2)
        .map(|_| spawn_helper_program("marker_processes", &["claimer"], dir.path()))
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    for out in &mut outputs {
        wait_for_line(out, "ready");
    }
    fs::write(dir.path().join("go"), "").unwrap();
    let won: Vec<Vec<u32>> = outputs
        .into_iter()
        .map(|out| {
            out.lines()
                .map_while(Result::ok)
                .filter_map(|l| l.rsplit("won ").next()?.trim().parse().ok())
                .collect()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_exactly_one_winner(&won[0], &won[1]);
}

// ---------------------------------------------------------------------------------------------
// Sweeping and clearing.
// ---------------------------------------------------------------------------------------------

#[test]
fn sweep_removes_old_leftovers_and_dead_slots_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    let me = ProcessIdentity::current().unwrap();
    let now = Utc::now();
    let old = std::time::SystemTime::now() - Duration::from_secs(61);

    let old_temp = dir.path().join(".planned-stop-5.json.tmp-99-0");
    let old_taken = dir.path().join(".planned-stop-6.json.taken-99-1");
    let fresh_temp = dir.path().join(".planned-stop-7.json.tmp-99-2");
    let unrelated = dir.path().join("notes.txt");
    for p in [&old_temp, &old_taken, &fresh_temp, &unrelated] {
        fs::write(p, "x").unwrap();
    }
    for p in [&old_temp, &old_taken, &unrelated] {
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    // Ours and fresh: kept. Expired: removed. Owner long gone (pid u32::MAX never exists): removed.
    let ours = store
        .write(&Marker::new(me.pid, Some(me.start), now))
        .unwrap();
    let gone = Marker::new(u32::MAX - 1, None, now);
    let gone_slot = store.write(&gone).unwrap();
    let garbage = dir.path().join("planned-stop-3.json");
    fs::write(&garbage, "garbage").unwrap();

    let SweepReport {
        mut removed_slots,
        mut removed_leftovers,
        ..
    } = store.sweep(now).unwrap();
    removed_slots.sort();
    removed_leftovers.sort();
    let mut expected_slots = vec![gone_slot, garbage];
    expected_slots.sort();
    assert_eq!(removed_slots, expected_slots);
    assert_eq!(removed_leftovers, vec![old_temp, old_taken]);
    assert!(ours.exists() && fresh_temp.exists() && unrelated.exists());

    // An expired marker for us goes too.
    store
        .write(&Marker::new(
            me.pid,
            Some(me.start),
            now - TimeDelta::seconds(120),
        ))
        .unwrap();
    assert_eq!(store.sweep(now).unwrap().removed_slots, vec![ours.clone()]);
    assert!(!ours.exists());
}

#[test]
fn clear_removes_whatever_is_at_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    assert!(!store.clear(9).unwrap());
    store.write(&Marker::new(9, None, Utc::now())).unwrap();
    assert!(store.clear(9).unwrap());
    fs::create_dir(store.slot_path(9)).unwrap();
    assert!(store.clear(9).unwrap());
    assert!(!store.slot_path(9).exists());
}

#[test]
fn sweep_removes_old_outcome_files_of_processes_that_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    // Outcome files as docs/protocol.md describes them, written as the runner writes them.
    let write_outcome = |pid: u32, start: u64| {
        let now = Utc::now();
        let json = serde_json::json!({
            "pid": pid, "start": start, "phase": "stopped",
            "cause": { "kind": "marker" }, "verdict": "planned", "request_id": null,
            "accepted_at": now, "drain_deadline": now, "finished_at": now, "exit_code": 0,
        });
        let path = store.outcome_path(pid);
        fs::write(&path, json.to_string()).unwrap();
        assert!(store.read_outcome(pid).is_some(), "a valid outcome file");
        path
    };
    sweeps_files_of_gone_processes(&store, write_outcome, || store.outcomes().unwrap().len());
}

#[test]
fn sweep_removes_old_presence_files_of_processes_that_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    // Presence files as docs/protocol.md describes them.
    let write_presence = |pid: u32, start: u64| {
        let json = serde_json::json!({ "pid": pid, "start": start, "since": Utc::now() });
        let path = store.presence_path(pid);
        fs::write(&path, json.to_string()).unwrap();
        assert!(store.read_presence(pid).is_some(), "a valid presence file");
        path
    };
    sweeps_files_of_gone_processes(&store, write_presence, || store.presences().unwrap().len());
}

/// A per-process file (outcome or presence) goes once it is older than the TTL and its process is
/// gone, and only then.
fn sweeps_files_of_gone_processes(
    store: &MarkerStore,
    write: impl Fn(u32, u64) -> PathBuf,
    count: impl Fn() -> usize,
) {
    let me = ProcessIdentity::current().unwrap();
    let ours = write(me.pid, me.start);
    let gone = write(u32::MAX - 1, 1);
    let fresh_gone = write(u32::MAX - 2, 1);
    let old = std::time::SystemTime::now() - Duration::from_secs(61);
    let age = |p: &PathBuf| {
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(old)
            .unwrap()
    };
    age(&ours);
    age(&gone);
    assert_eq!(count(), 3);
    let report = store.sweep(Utc::now()).unwrap();
    assert_eq!(report.removed_leftovers, vec![gone.clone()]);
    assert!(ours.exists(), "the file of a live process stays");
    assert!(
        fresh_gone.exists(),
        "fresh files stay for stoppers still waiting"
    );
    // An old file at our pid from an earlier process (another start) goes.
    assert_eq!(write(me.pid, me.start + 1), ours);
    age(&ours);
    assert_eq!(
        store.sweep(Utc::now()).unwrap().removed_leftovers,
        vec![ours]
    );
}

/// The probe's first contract, two tests under their first names: the watcher's probe goes through
/// `MarkerStore::probe`.
#[test]
fn test_planned_stop_marker_targets_self_probe_is_non_destructive() {
    let dir = tempfile::tempdir().unwrap();
    let marker = shared_marker(dir.path());
    write_self_marker(&marker, false);
    let store = MarkerStore::open(Layout::SingleFile(marker.clone())).unwrap();
    let me = ProcessIdentity::current().unwrap();

    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::ForSelf(_)
    ));
    assert!(marker.exists(), "probe must not consume a matching marker");
    // Idempotent: still for us on a second call.
    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::ForSelf(_)
    ));
    assert!(marker.exists());
}

#[test]
fn test_planned_stop_marker_targets_self_drops_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = shared_marker(dir.path());
    std::fs::write(&marker, "{not valid json").unwrap();
    let store = MarkerStore::open(Layout::SingleFile(marker.clone())).unwrap();
    let me = ProcessIdentity::current().unwrap();

    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::Malformed(_)
    ));
    assert!(!marker.exists(), "a malformed marker is cleaned up");
}

/// A directory with contents at a slot: the probe reports it once (not on every poll), and
/// `write` (the stopper) and `clear` say what is in the way and how to remove it. Its contents
/// are never touched.
#[test]
fn a_directory_with_contents_at_a_slot_is_logged_once_and_named_by_write_and_clear() {
    let logs = common::actors::LogCapture::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    let store = slots_store(dir.path());
    let me = ProcessIdentity::current().unwrap();
    let slot = store.slot_path(me.pid);
    fs::create_dir(&slot).unwrap();
    fs::write(slot.join("keep"), b"someone's file").unwrap();
    for _ in 0..5 {
        assert!(matches!(
            store.probe(&me, Utc::now()).unwrap(),
            Judgement::Malformed(_)
        ));
    }
    assert_eq!(
        logs.count(tracing::Level::WARN, "sits at the marker slot"),
        1,
        "logged once, not on every poll"
    );
    let written = store.write(&Marker::new(me.pid, Some(me.start), Utc::now()));
    assert!(
        matches!(&written, Err(StoreError::DirectoryInTheWay { path }) if *path == slot),
        "{written:?}"
    );
    assert!(written.unwrap_err().to_string().contains("rm -r"));
    assert!(matches!(
        store.clear(me.pid),
        Err(StoreError::DirectoryInTheWay { .. })
    ));
    assert!(slot.join("keep").exists(), "its contents are never deleted");
}

/// The private-directory policy holds for the life of the store, not only when it is opened: a
/// directory made writable by group or others while the service runs makes the probe and the
/// claim refuse whatever is found there (anyone could have planted it), until it is private again.
#[cfg(unix)]
#[test]
fn a_directory_made_shared_while_open_is_refused_until_it_is_private_again() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let store = MarkerStore::open(Layout::Slots(run.clone())).unwrap();
    let me = ProcessIdentity::current().unwrap();
    store
        .write(&Marker::new(me.pid, Some(me.start), Utc::now()))
        .unwrap();
    fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        store.probe(&me, Utc::now()),
        Err(StoreError::SharedDirectory { mode: 0o777, .. })
    ));
    assert!(matches!(
        store.claim(&me, Utc::now()),
        Err(StoreError::SharedDirectory { .. })
    ));
    assert!(store.slot_path(me.pid).exists(), "nothing was acted on");
    fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
    assert!(matches!(
        store.probe(&me, Utc::now()).unwrap(),
        Judgement::ForSelf(_)
    ));
}

/// A directory that cannot be listed (here: removed after the store was opened) is an
/// error from `outcomes()` and `presences()`, not an empty list that says "nothing there".
#[test]
fn outcomes_and_presences_report_a_directory_they_cannot_list() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let store = slots_store(&run);
    assert!(store.outcomes().unwrap().is_empty());
    assert!(store.presences().unwrap().is_empty());
    fs::remove_dir_all(&run).unwrap();
    assert!(
        store.outcomes().is_err(),
        "a missing directory is no empty one"
    );
    assert!(
        store.presences().is_err(),
        "a missing directory is no empty one"
    );
}
