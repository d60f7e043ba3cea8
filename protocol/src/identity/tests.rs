use super::*;

fn stat_line(name: &str, state: &str, start: u64) -> Vec<u8> {
    format!(
        "4242 ({name}) {state} 1 4242 4242 0 -1 4194560 150 0 0 0 3 1 0 0 20 0 1 0 {start} 1000 20 \
         18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
    )
    .into_bytes()
}

#[test]
fn starttime_is_field_22_counted_after_the_last_parenthesis() {
    for name in [
        "bash",
        "a b",
        "x) (y",
        ") S 1 2 3 4 5",
        "((",
        "))",
        "tab\there",
        "",
    ] {
        let parsed = parse_proc_stat(&stat_line(name, "S", 987_654)).unwrap();
        assert_eq!(
            parsed,
            ProcStat {
                start: 987_654,
                alive: true
            },
            "name {name:?}"
        );
    }
}

#[test]
fn zombies_and_dead_processes_are_not_alive() {
    assert!(!parse_proc_stat(&stat_line("z", "Z", 5)).unwrap().alive);
    assert!(!parse_proc_stat(&stat_line("z", "X", 5)).unwrap().alive);
    assert!(parse_proc_stat(&stat_line("r", "R", 5)).unwrap().alive);
}

#[test]
fn malformed_stat_lines_give_none() {
    for line in [
        &b""[..],
        b"no parens at all",
        b"1 (x) S 1 2",
        b"1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -5",
        b"1 (\xff) \xff",
    ] {
        assert_eq!(
            parse_proc_stat(line),
            None,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
}

#[test]
fn current_matches_of_own_pid() {
    let me = ProcessIdentity::current().unwrap();
    assert_eq!(me.pid, std::process::id());
    assert_eq!(ProcessIdentity::of(me.pid), Some(me));
    let age = Utc::now().signed_duration_since(me.started_at);
    assert!(
        age >= chrono::TimeDelta::seconds(-2),
        "started in the future: {age}"
    );
}

#[cfg(unix)]
#[test]
fn a_reaped_child_has_no_identity() {
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    let running = ProcessIdentity::of(pid).expect("a running child has an identity");
    child.kill().unwrap();
    child.wait().unwrap();
    // The pid may have been reused by now, but never by a process with the same identity.
    assert_ne!(ProcessIdentity::of(pid), Some(running));
    assert_eq!(ProcessIdentity::of(0), None);
}

#[cfg(target_os = "linux")]
#[test]
fn a_zombie_child_has_no_identity() {
    let child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Not waited for: once it exits it stays a zombie until reaped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ProcessIdentity::of(pid).is_some() {
        assert!(std::time::Instant::now() < deadline, "child never exited");
        std::thread::yield_now();
    }
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap();
    assert!(
        !parse_proc_stat(&stat).unwrap().alive,
        "the child is a zombie, not reaped"
    );
    drop(child);
}

#[cfg(target_os = "linux")]
#[test]
fn the_proc_wall_clock_agrees_with_sysinfo() {
    let me = ProcessIdentity::current().unwrap();
    let sys = sysinfo_start_time(me.pid).unwrap() as i64;
    let diff = (me.started_at.timestamp() - sys).abs();
    assert!(
        diff <= 2,
        "/proc says {}, sysinfo says {sys}",
        me.started_at
    );
}

#[cfg(windows)]
#[test]
fn the_windows_creation_time_agrees_with_sysinfo_and_is_finer() {
    let me = ProcessIdentity::current().unwrap();
    let sys = sysinfo_start_time(me.pid).unwrap() as i64;
    let diff = (me.started_at.timestamp() - sys).abs();
    assert!(
        diff <= 2,
        "GetProcessTimes says {}, sysinfo says {sys}",
        me.started_at
    );
    // 100 ns ticks since 1601, not seconds since 1970.
    assert!(me.start > 116_444_736_000_000_000, "{}", me.start);
}
