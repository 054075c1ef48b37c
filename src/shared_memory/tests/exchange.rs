//! An exporter and importers in one process, over real sockets.

use super::super::message::limits;
use super::super::*;
use super::{bytes_at, pattern, TempLedger};
use crate::shared_memory::transport::Channel;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn exporter(ledger: &TempLedger, name: &str, options: ExportOptions) -> Exporter {
    Exporter::in_ledger(&ledger.dir, name, options).unwrap()
}

fn attach(ledger: &TempLedger, name: &str) -> Attachment {
    Attachment::in_ledger(&ledger.dir, name, AttachOptions::default()).unwrap()
}

/// A writable memory file of `size` bytes holding `pattern(seed)`.
fn filled(size: u64, seed: u64) -> MemfdSegment {
    let seg = MemfdSegment::new(size, true).unwrap();
    seg.host_map()
        .write(0, &pattern(seed, size as usize))
        .unwrap();
    seg
}

#[test]
fn an_importer_reads_what_the_exporter_wrote_and_writes_back() {
    let ledger = TempLedger::new("exchange");
    let exp = exporter(&ledger, "e", ExportOptions::default());
    let seg = exp.add_segment(filled(1 << 20, 1));
    exp.publish("a", bytes_at(seg, 4096, 8192, false)).unwrap();
    exp.publish("ro", bytes_at(seg, 0, 4096, true)).unwrap();
    assert!(matches!(
        exp.publish("a", bytes_at(seg, 0, 1, false)),
        Err(ShareError::NameTaken(_))
    ));
    let mut imp = attach(&ledger, "e");
    assert_eq!(imp.exporter_pid(), std::process::id());
    let a = imp.resolve("a").unwrap();
    assert_eq!(
        (a.size, a.offset, a.readonly, a.host),
        (8192, 4096, false, true)
    );
    assert_eq!(
        (a.dtype.as_str(), a.shape.as_slice()),
        ("|u1", &[8192u64][..])
    );
    assert_eq!(
        imp.read(&a).unwrap(),
        &pattern(1, 1 << 20)[4096..4096 + 8192]
    );
    imp.write(&a, 8, b"imported").unwrap();
    let host = exp.segment(seg).unwrap();
    assert_eq!(host.host().unwrap().read(4096 + 8, 8).unwrap(), b"imported");
    assert!(imp.write(&a, 8190, b"past").is_err());
    let ro = imp.resolve("ro").unwrap();
    assert!(ro.readonly);
    assert!(imp.write(&ro, 0, b"x").is_err());
    assert_eq!(imp.segments(), 1, "one segment, mapped once");
    assert_eq!(
        ro.addr + 4096,
        a.addr,
        "one map: addresses follow the offsets"
    );
    assert!(matches!(imp.resolve("nothing"), Err(ShareError::UnknownName(n)) if n == "nothing"));
    assert_eq!(
        imp.names().unwrap(),
        vec!["a".to_string(), "ro".to_string()]
    );
    let f = exp.figures();
    assert_eq!((f.segments, f.names, f.importers, f.leases), (1, 2, 1, 2));
    assert_eq!(imp.release(&["a", "ro", "nothing"]).unwrap(), 2);
    assert_eq!(exp.figures().leases, 0);
}

#[test]
fn a_free_waits_for_every_importer_that_maps_the_buffer() {
    let ledger = TempLedger::new("free");
    let exp = exporter(&ledger, "e", ExportOptions::default());
    let seg = exp.add_segment(filled(1 << 16, 2));
    exp.publish("a", bytes_at(seg, 0, 64, false)).unwrap();
    exp.publish("b", bytes_at(seg, 64, 64, false)).unwrap();
    let mut one = attach(&ledger, "e");
    let mut two = attach(&ledger, "e");
    one.resolve("a").unwrap();
    two.resolve("a").unwrap();
    let freed = Arc::new(AtomicBool::new(false));
    let flag = freed.clone();
    let outcome = exp.free("a", move || flag.store(true, Ordering::SeqCst));
    assert_eq!(outcome.unwrap(), FreeOutcome::Deferred { holders: 2 });
    assert!(two.resolve("b").is_ok());
    let mut three = attach(&ledger, "e");
    assert!(
        matches!(three.resolve("a"), Err(ShareError::UnknownName(_))),
        "a freed name resolves no more"
    );
    assert_eq!(
        one.resolve("a").unwrap().size,
        64,
        "held: still resolves here"
    );
    let f = exp.figures();
    assert_eq!((f.deferred_frees, f.deferred_total, f.names), (1, 1, 1));
    assert_eq!(one.release(&["a"]).unwrap(), 1);
    assert!(
        !freed.load(Ordering::SeqCst),
        "another importer still maps it"
    );
    drop(two); // its socket closes: its leases go
    assert!(exp.wait_for(Duration::from_secs(5), |f| f.deferred_frees == 0));
    assert!(freed.load(Ordering::SeqCst));
    assert_eq!(exp.figures().frees_after_wait, 1);
    // Nobody holds "b" now: its free runs at once.
    let now = Arc::new(AtomicBool::new(false));
    let flag = now.clone();
    assert!(matches!(
        exp.free("b", move || flag.store(true, Ordering::SeqCst)),
        Ok(FreeOutcome::Now)
    ));
    assert!(now.load(Ordering::SeqCst));
    assert!(matches!(exp.withdraw("b"), Err(ShareError::UnknownName(_))));
}

#[test]
fn a_read_only_segment_is_exported_read_only() {
    let ledger = TempLedger::new("readonly");
    let exp = exporter(&ledger, "e", ExportOptions::default());
    let seg = MemfdSegment::new(1 << 16, false).unwrap();
    seg.host_map().write(0, b"weights").unwrap();
    let seg = exp.add_segment(seg);
    let e = exp.publish("w", bytes_at(seg, 0, 7, false)).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    assert!(
        exp.publish("x", bytes_at(seg, 1 << 16, 1, true)).is_err(),
        "outside"
    );
    assert!(
        exp.publish("y", bytes_at(99, 0, 1, true)).is_err(),
        "no such segment"
    );
    assert!(exp.publish("bad\nname", bytes_at(seg, 0, 1, true)).is_err());
    exp.publish("w", bytes_at(seg, 0, 7, true)).unwrap();
    let mut imp = attach(&ledger, "e");
    let w = imp.resolve("w").unwrap();
    assert!(w.readonly);
    assert_eq!(imp.read(&w).unwrap(), b"weights");
}

#[test]
fn an_importer_keeps_what_it_maps_when_its_exporter_goes() {
    let ledger = TempLedger::new("gone");
    let exp = exporter(&ledger, "e", ExportOptions::default());
    let seg = exp.add_segment(filled(1 << 16, 3));
    exp.publish("a", bytes_at(seg, 0, 1 << 16, false)).unwrap();
    exp.publish("later", bytes_at(seg, 0, 1, false)).unwrap();
    let mut imp = attach(&ledger, "e");
    let a = imp.resolve("a").unwrap();
    drop(exp);
    assert!(!ledger.path("e").exists(), "its socket is removed");
    assert_eq!(imp.read(&a).unwrap(), pattern(3, 1 << 16));
    assert_eq!(
        imp.resolve("a").unwrap(),
        a,
        "resolved before: still resolves"
    );
    assert!(matches!(imp.resolve("later"), Err(ShareError::Gone)));
    assert!(imp.exporter_gone());
    assert_eq!(imp.read(&a).unwrap(), pattern(3, 1 << 16));
    assert!(matches!(
        Attachment::in_ledger(&ledger.dir, "e", AttachOptions::default()),
        Err(ShareError::Gone)
    ));
}

#[test]
fn a_new_exporter_adopts_the_segments_back_copying_nothing() {
    let ledger = TempLedger::new("adopt");
    let exp = exporter(&ledger, "old", ExportOptions::default());
    let one = exp.add_segment(filled(1 << 16, 4));
    let two = exp.add_segment(filled(1 << 16, 5));
    exp.publish("a", bytes_at(one, 0, 100, false)).unwrap();
    exp.publish("b", bytes_at(two, 100, 100, true)).unwrap();
    exp.publish("unheld", bytes_at(two, 0, 1, false)).unwrap();
    let mut imp = attach(&ledger, "old");
    let before = imp.resolve_many(&["a", "b"]).unwrap();
    drop(exp);
    // An exporter that adopts nothing says so.
    let plain = exporter(&ledger, "plain", ExportOptions::default());
    let e = imp.hand_back(&ledger.path("plain")).unwrap_err();
    assert!(
        matches!(
            e,
            ShareError::Refused {
                reason: Refusal::NotAllowed,
                ..
            }
        ),
        "{e}"
    );
    drop(plain);
    let adopting = ExportOptions {
        accept_adoption: true,
        ..ExportOptions::default()
    };
    let new = exporter(&ledger, "new", adopting);
    let started = Instant::now();
    assert_eq!(imp.hand_back(&ledger.path("new")).unwrap(), (2, 2));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(new.names(), vec!["a".to_string(), "b".to_string()]);
    let f = new.figures();
    assert_eq!((f.adopted_segments, f.adopted_names, f.leases), (2, 2, 2));
    // The same memory, not a copy: a write through the new exporter shows in the old map.
    let a = imp.resolve("a").unwrap();
    assert_eq!(a.addr, before[0].addr, "still the same map here");
    let spec = new.spec("a").unwrap();
    let seg = new.segment(spec.segment).unwrap();
    seg.host().unwrap().write(0, b"adopted").unwrap();
    assert_eq!(&imp.read(&a).unwrap()[..7], b"adopted");
    // Another importer reads it from the new exporter, bit-exact.
    let mut other = attach(&ledger, "new");
    let b = other.resolve("b").unwrap();
    assert!(b.readonly);
    assert_eq!(other.read(&b).unwrap(), &pattern(5, 1 << 16)[100..200]);
    // The adopter holds leases: a free waits for it.
    assert!(matches!(
        new.withdraw("a"),
        Ok(FreeOutcome::Deferred { holders: 1 })
    ));
    assert_eq!(imp.release(&["a"]).unwrap(), 1);
    assert!(new.wait_for(Duration::from_secs(5), |f| f.deferred_frees == 0));
}

#[test]
fn many_names_in_many_segments_resolve_in_batches() {
    let ledger = TempLedger::new("many");
    let exp = exporter(&ledger, "e", ExportOptions::default());
    let segments = limits::SEGMENTS + 8;
    let names_per_segment = 8;
    let mut names = Vec::new();
    for s in 0..segments {
        let seg = exp.add_segment(filled(1 << 16, s as u64));
        for k in 0..names_per_segment {
            let name = format!("s{s:03}-n{k}");
            exp.publish(&name, bytes_at(seg, k * 4096, 4096, false))
                .unwrap();
            names.push(name);
        }
    }
    assert!(names.len() > limits::BATCH);
    let mut imp = attach(&ledger, "e");
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let all = imp.resolve_many(&refs).unwrap();
    assert_eq!(all.len(), names.len());
    assert_eq!(imp.segments(), segments, "each segment mapped once");
    for (i, r) in all.iter().enumerate() {
        let s = i / names_per_segment as usize;
        let k = i % names_per_segment as usize;
        assert_eq!(
            imp.read(r).unwrap(),
            &pattern(s as u64, 1 << 16)[k * 4096..(k + 1) * 4096]
        );
    }
    assert_eq!(imp.names().unwrap(), names, "listed in pages, in order");
    assert_eq!(exp.figures().leases, names.len() as u64);
    assert_eq!(imp.release(&refs).unwrap(), names.len() as u32);
}

#[test]
fn an_importer_that_does_not_read_is_muted_and_keeps_its_leases() {
    let ledger = TempLedger::new("mute");
    let options = ExportOptions {
        send_timeout: Duration::from_millis(50),
        ..ExportOptions::default()
    };
    let exp = exporter(&ledger, "e", options);
    let seg = exp.add_segment(filled(1 << 16, 6));
    let long: Vec<String> = (0..limits::BATCH)
        .map(|i| format!("{i:0>width$}", width = limits::NAME))
        .collect();
    for name in &long {
        exp.publish(name, bytes_at(seg, 0, 1, false)).unwrap();
    }
    // A raw importer that asks and never reads: the answers fill its queue.
    let stuck =
        Channel::connect(&ledger.path("e"), Instant::now() + Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seq = 1;
    let hello = super::super::message::Frame::new(seq, super::super::message::Message::Hello);
    stuck.send(&hello.encode().unwrap(), &[], deadline).unwrap();
    while exp.figures().muted == 0 && Instant::now() < deadline {
        seq += 1;
        let ask = super::super::message::Message::Resolve {
            names: long.clone(),
        };
        let frame = super::super::message::Frame::new(seq, ask);
        if stuck
            .send(
                &frame.encode().unwrap(),
                &[],
                Instant::now() + Duration::from_millis(20),
            )
            .is_err()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(
        exp.figures().muted,
        1,
        "the importer that does not read is muted"
    );
    // Others are served at once meanwhile.
    let started = Instant::now();
    let mut imp = attach(&ledger, "e");
    imp.resolve(&long[0]).unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    // Its leases hold while its socket is open: it may still map them.
    assert!(matches!(
        exp.withdraw(&long[1]),
        Ok(FreeOutcome::Deferred { holders: 1 })
    ));
    drop(stuck);
    assert!(
        exp.wait_for(Duration::from_secs(5), |f| f.deferred_frees == 0
            && f.importers == 1)
    );
}

#[test]
fn past_the_most_importers_a_connection_is_refused_busy() {
    let ledger = TempLedger::new("busy");
    let options = ExportOptions {
        max_importers: 1,
        ..ExportOptions::default()
    };
    let _exp = exporter(&ledger, "e", options);
    let _one = attach(&ledger, "e");
    let e = Attachment::in_ledger(&ledger.dir, "e", AttachOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            ShareError::Refused {
                reason: Refusal::Busy,
                ..
            }
        ),
        "{e}"
    );
}
