//! Replays over tiers (`tiered`: device, peer GPU, host on simulated devices) and the sleep
//! figures of an expandable pool, through [`compare`] as `rrmm replay` runs them.

use super::*;

const MIB: usize = 1 << 20;

fn log_file(tag: &str, rows: &[(&str, usize, usize)]) -> String {
    let path = crate::adaptor::test_util::temp_log_path(tag);
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for (action, ptr, size) in rows {
        text.push_str(&format!("1,t,{action},{ptr:#x},{size},0\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// Three allocations of 6 MiB on an 8 MiB device with an 8 MiB peer: one per tier. The record
/// gives each tier's peak and totals over the figures pass (the repetitions do not add to
/// them), and nothing fails.
#[test]
fn a_tiered_replay_reports_bytes_and_peaks_per_tier() {
    let six = 6 * MIB;
    let log = log_file(
        "tiers",
        &[
            ("allocate", 0x1000, six),
            ("allocate", 0x2000, six),
            ("allocate", 0x3000, six),
            ("free", 0x1000, six),
            ("free", 0x2000, six),
            ("free", 0x3000, six),
        ],
    );
    let settings = CompareSettings {
        simulate: Some(8 * MIB),
        options: ResourceOptions {
            initial_pool_size: Some(8 * MIB),
            maximum_pool_size: Some(8 * MIB),
            peer_memory: Some(8 * MIB),
            host_memory: Some(64 * MIB),
            ..ResourceOptions::default()
        },
        replay: ReplayOptions {
            repeat: Repeat::Times(3),
            ..ReplayOptions::default()
        },
        lenient: false,
    };
    let records = compare(&[&log], &["tiered", "pool"], &settings).unwrap();
    let _ = std::fs::remove_file(&log);
    let tiered = &records[0];
    assert_eq!(tiered.error, None);
    assert_eq!(tiered.failed_allocations, Some(0));
    let tiers = tiered.tiers.as_ref().expect("counts per tier");
    let names: Vec<_> = tiers.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["device", "peer", "host"]);
    for t in tiers {
        assert_eq!(
            (t.peak_bytes, t.total_allocations, t.current_bytes),
            (six, 1, 0)
        );
    }
    assert_eq!(tiers[0].refused, 2, "the device passed two requests on");
    assert_eq!(tiered.sleep_releases_at_end, None, "a pool cannot sleep");
    // The plain pool fails the two beyond the device, and has no tiers.
    assert_eq!(records[1].failed_allocations, Some(2));
    assert_eq!(records[1].tiers, None);
    let json = serde_json::to_string(tiered).unwrap();
    assert!(json.contains("\"tiers\":[{\"name\":\"device\""), "{json}");
}

/// An expandable pool: a sleep after the last event would release every mapped byte and copy
/// the one allocation still live.
#[test]
fn an_expandable_replay_says_what_a_sleep_would_free() {
    let log = log_file(
        "sleep",
        &[
            ("allocate", 0x1000, 3 * MIB),
            ("allocate", 0x2000, 5 * MIB),
            ("free", 0x2000, 5 * MIB),
        ],
    );
    let settings = CompareSettings {
        simulate: Some(64 * MIB),
        ..CompareSettings::default()
    };
    let records = compare(&[&log], &["expandable"], &settings).unwrap();
    let _ = std::fs::remove_file(&log);
    let r = &records[0];
    assert_eq!(r.sleep_copies_at_end, Some(3 * MIB as u128));
    let mapped = r.sleep_releases_at_end.unwrap();
    assert_eq!(Some(mapped), r.footprint_at_end);
    assert!(mapped >= 3 * MIB && mapped % (2 * MIB) == 0, "{mapped}");
    assert!(r.sleep_releases_at_peak.unwrap() >= 8 * MIB);
}

/// `--fit` of `tiered`: the smallest device on which nothing reaches host memory, the device
/// and a peer GPU of the same size holding the log (here 12 MiB live in 1 MiB allocations:
/// smaller than the one device a plain pool needs).
#[test]
fn a_tiered_fit_is_the_smallest_device_whose_peer_holds_the_rest() {
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 1..=12 {
        log.push_str(&format!("1,t,allocate,{:#x},{MIB},0\n", i << 24));
    }
    for i in 1..=12 {
        log.push_str(&format!("1,t,free,{:#x},{MIB},0\n", i << 24));
    }
    let trace = Trace::from_reader("fit.csv", log.as_bytes(), false).unwrap();
    let options = ResourceOptions::default();
    let tiered = fit(&trace, "tiered", &options).unwrap();
    let pool = fit(&trace, "pool", &options).unwrap();
    let (t, p) = (tiered.device_bytes.unwrap(), pool.device_bytes.unwrap());
    assert!(t >= 6 * MIB && t < p, "tiered {t}, pool {p}");
    // On the size found, nothing reached host memory.
    let built = build("tiered", Some(t), &options).unwrap();
    let r = replay(
        &trace,
        &built.resource,
        ReplayOptions {
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!(r.tiers.unwrap()[2].peak_bytes, 0);
}
