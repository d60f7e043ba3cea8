//! Arbitrary `/proc/<pid>/stat` lines never panic the parser, and well-formed lines give the right
//! `starttime` whatever the process name (spaces, parentheses, invalid UTF-8).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use planned_stop_protocol::identity::parse_proc_stat;

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    WellFormed { pid: u32, name: Vec<u8>, state: u8, start: u64, tail: u8 },
}

fuzz_target!(|input: Input| match input {
    Input::Raw(bytes) => {
        let _ = parse_proc_stat(&bytes);
    }
    Input::WellFormed { pid, name, state, start, tail } => {
        let state = [b'R', b'S', b'D', b'Z', b'T', b't', b'X', b'I'][usize::from(state % 8)];
        let mut line = format!("{pid} (").into_bytes();
        line.extend_from_slice(&name);
        line.extend_from_slice(b") ");
        line.push(state);
        line.extend_from_slice(b" 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 ");
        line.extend_from_slice(start.to_string().as_bytes());
        for i in 0..tail % 30 {
            line.extend_from_slice(format!(" {i}").as_bytes());
        }
        line.push(b'\n');
        let parsed = parse_proc_stat(&line).expect("a well-formed line parses");
        assert_eq!(parsed.start, start);
        assert_eq!(parsed.alive, !matches!(state, b'Z' | b'X'));
    }
});
