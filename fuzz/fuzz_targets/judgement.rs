//! Marker bytes + own identity + now + policy → `decide`: ForSelf only for our pid and a fresh
//! marker written after our start; the same input always gives the same verdict.
#![no_main]

use arbitrary::Arbitrary;
use chrono::{DateTime, TimeDelta, Utc};
use libfuzzer_sys::fuzz_target;
use planned_stop_protocol::judgement::{SlotContent, decide};
use planned_stop_protocol::ProcessIdentity;
use planned_stop_protocol::marker::{Marker, Policy, Judgement};
use std::time::Duration;

#[derive(Debug, Arbitrary)]
enum Bytes {
    /// Anything at all.
    Raw(Vec<u8>),
    /// A well-formed marker near our identity, to reach the interesting branches.
    Built { other_pid: bool, start: Option<u64>, offset_ms: i64, trigger: bool },
}

#[derive(Debug, Arbitrary)]
struct Input {
    bytes: Bytes,
    pid: u32,
    start: u64,
    started_ms: i64,
    now_ms: i64,
    ttl_ms: u32,
    skew_ms: u32,
    slack_ms: u32,
}

fn time(ms: i64) -> DateTime<Utc> {
    // Keep within the range RFC 3339 can write (years 1..=9999).
    const YEAR_1: i64 = -62_135_596_800_000;
    const YEAR_9999_END: i64 = 253_402_300_799_000;
    DateTime::from_timestamp_millis(ms.rem_euclid(YEAR_9999_END - YEAR_1) + YEAR_1)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

fuzz_target!(|input: Input| {
    let own = ProcessIdentity::new(input.pid.max(1), input.start, time(input.started_ms));
    let now = time(input.now_ms);
    let policy = Policy::default()
        .with_ttl(Duration::from_millis(input.ttl_ms.into()))
        .with_future_skew(Duration::from_millis(input.skew_ms.into()))
        .with_start_slack(Duration::from_millis(input.slack_ms.into()));
    let bytes = match input.bytes {
        Bytes::Raw(b) => b,
        Bytes::Built { other_pid, start, offset_ms, trigger } => {
            let pid = if other_pid { own.pid.wrapping_add(1).max(1) } else { own.pid };
            let at = now.checked_add_signed(TimeDelta::milliseconds(offset_ms % 10_000_000)).unwrap_or(now);
            match Marker::new(pid, start, at).with_trigger_watcher(trigger).to_json() {
                Ok(b) => b,
                Err(_) => return,
            }
        }
    };
    let first = decide(SlotContent::Bytes(&bytes), &own, now, &policy);
    let second = decide(SlotContent::Bytes(&bytes), &own, now, &policy);
    assert_eq!(first, second, "the same input gave two verdicts");
    if let Ok(Judgement::ForSelf(m)) = first {
        assert_eq!(m.target_pid, own.pid, "ForSelf for another pid");
        assert!(m.target_start_time.is_none_or(|s| s == own.start), "ForSelf for another start");
        let age = now.signed_duration_since(m.written_at);
        assert!(age <= TimeDelta::from_std(policy.ttl).unwrap(), "ForSelf for an expired marker");
        assert!(-age <= TimeDelta::from_std(policy.future_skew).unwrap(), "ForSelf for a future marker");
        let earliest = own.started_at - TimeDelta::from_std(policy.start_slack).unwrap();
        assert!(m.written_at >= earliest, "ForSelf for a marker written before we started");
    }
});
