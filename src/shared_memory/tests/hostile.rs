//! Hostile importers against a live exporter: random, truncated, corrupted and replayed
//! packets, with and without descriptors. After each packet the exporter answers or refuses
//! (one answer a packet), and an honest importer is served bit-exact at the end.

use super::super::message::tests::any_message;
use super::super::message::{Frame, Message};
use super::super::transport::Channel;
use super::super::*;
use super::{bytes_at, pattern, TempLedger};
use proptest::prelude::*;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// One packet a hostile importer sends.
#[derive(Debug, Clone)]
enum Packet {
    /// A message, numbered as the exporter expects (`shift` 0) or not.
    Message { message: Message, shift: i8 },
    /// A message cut short.
    Truncated {
        message: Message,
        keep: prop::sample::Index,
    },
    /// A message with one byte changed.
    Corrupted {
        message: Message,
        at: prop::sample::Index,
        byte: u8,
    },
    /// Random bytes.
    Bytes(Vec<u8>),
    /// The last packet sent, again.
    Replay,
    /// A resolve of an exported name with descriptors it should not carry.
    WithDescriptors(u8),
}

fn any_packet() -> impl Strategy<Value = Packet> {
    let resolve = Just(Message::Resolve {
        names: vec!["a".into(), "nothing".into()],
    });
    prop_oneof![
        3 => (prop_oneof![Just(Message::Hello), resolve, any_message()], prop_oneof![4 => Just(0i8), 1 => -2i8..3])
            .prop_map(|(message, shift)| Packet::Message { message, shift }),
        1 => (any_message(), any::<prop::sample::Index>())
            .prop_map(|(message, keep)| Packet::Truncated { message, keep }),
        1 => (any_message(), any::<prop::sample::Index>(), any::<u8>())
            .prop_map(|(message, at, byte)| Packet::Corrupted { message, at, byte }),
        1 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Packet::Bytes),
        1 => Just(Packet::Replay),
        1 => (1u8..4).prop_map(Packet::WithDescriptors),
    ]
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn memfd() -> OwnedFd {
    MemfdSegment::new(4096, true)
        .map(|s| s.descriptor().unwrap().try_clone_to_owned().unwrap())
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_hostile_importer_is_answered_or_refused_and_the_exporter_serves_on(
        packets in prop::collection::vec(any_packet(), 1..40),
    ) {
        let ledger = TempLedger::new("hostile");
        let options = ExportOptions { max_refusals: 1000, ..ExportOptions::default() };
        let exp = Exporter::in_ledger(&ledger.dir, "e", options).unwrap();
        let seg = MemfdSegment::new(1 << 16, true).unwrap();
        seg.host_map().write(0, &pattern(9, 1 << 16)).unwrap();
        let seg = exp.add_segment(seg);
        exp.publish("a", bytes_at(seg, 0, 1 << 16, false)).unwrap();

        let hostile = Channel::connect(&ledger.path("e"), soon()).unwrap();
        let mut next_seq: u32 = 1;
        let mut last: Vec<u8> = Vec::new();
        let mut refusals = 0u64;
        for packet in packets {
            let mut fds: Vec<OwnedFd> = Vec::new();
            let bytes = match packet {
                Packet::Message { message, shift } => {
                    let seq = next_seq.wrapping_add_signed(i32::from(shift));
                    Frame::new(seq, message).encode().unwrap()
                }
                Packet::Truncated { message, keep } => {
                    let b = Frame::new(next_seq, message).encode().unwrap();
                    b[..keep.index(b.len())].to_vec()
                }
                Packet::Corrupted { message, at, byte } => {
                    let mut b = Frame::new(next_seq, message).encode().unwrap();
                    let i = at.index(b.len());
                    b[i] = byte;
                    b
                }
                Packet::Bytes(b) => b,
                Packet::Replay => last.clone(),
                Packet::WithDescriptors(n) => {
                    fds = (0..n).map(|_| memfd()).collect();
                    let names = vec!["a".into()];
                    Frame::new(next_seq, Message::Resolve { names }).encode().unwrap()
                }
            };
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
            hostile.send(&bytes, &borrowed, soon()).unwrap();
            last = bytes.clone();
            // One answer a packet, numbered as the request when it was one in order.
            let answer = hostile.recv(soon()).unwrap();
            prop_assert!(answer.fds.len() <= 1, "at most the one segment");
            let frame = Frame::decode(&answer.bytes).unwrap();
            match frame.message {
                Message::Refused { .. } => refusals += 1,
                _ => {
                    let sent = Frame::decode(&bytes).unwrap();
                    prop_assert_eq!(sent.seq, next_seq, "only the next request is answered");
                    prop_assert_eq!(frame.seq, next_seq);
                    prop_assert!(fds.is_empty());
                    next_seq += 1;
                }
            }
        }
        prop_assert_eq!(exp.figures().refused, refusals);
        prop_assert_eq!(exp.figures().muted, 0);
        // An honest importer is served meanwhile, bit-exact.
        let mut honest = Attachment::in_ledger(&ledger.dir, "e", AttachOptions::default()).unwrap();
        let a = honest.resolve("a").unwrap();
        prop_assert_eq!(honest.read(&a).unwrap(), pattern(9, 1 << 16));
        drop(hostile);
        prop_assert!(exp.wait_for(Duration::from_secs(5), |f| f.importers == 1));
    }
}

#[test]
fn an_importer_past_its_refusals_is_muted_and_others_are_served() {
    let ledger = TempLedger::new("refusals");
    let options = ExportOptions {
        max_refusals: 3,
        ..ExportOptions::default()
    };
    let exp = Exporter::in_ledger(&ledger.dir, "e", options).unwrap();
    let seg = exp.add_segment(MemfdSegment::new(4096, true).unwrap());
    exp.publish("a", bytes_at(seg, 0, 16, false)).unwrap();
    let hostile = Channel::connect(&ledger.path("e"), soon()).unwrap();
    for _ in 0..4 {
        hostile.send(b"garbage", &[], soon()).unwrap();
        let answer = hostile.recv(soon()).unwrap();
        assert!(matches!(
            Frame::decode(&answer.bytes).unwrap().message,
            Message::Refused {
                reason: Refusal::Malformed,
                ..
            }
        ));
    }
    hostile.send(b"garbage", &[], soon()).unwrap();
    assert!(matches!(
        hostile.recv(Instant::now() + Duration::from_millis(200)),
        Err(ShareError::Timeout(_))
    ));
    assert_eq!(exp.figures().muted, 1);
    let mut honest = Attachment::in_ledger(&ledger.dir, "e", AttachOptions::default()).unwrap();
    assert_eq!(honest.resolve("a").unwrap().size, 16);
}

#[test]
fn a_replayed_request_is_refused_as_out_of_order() {
    let ledger = TempLedger::new("replay");
    let exp = Exporter::in_ledger(&ledger.dir, "e", ExportOptions::default()).unwrap();
    let seg = exp.add_segment(MemfdSegment::new(4096, true).unwrap());
    exp.publish("a", bytes_at(seg, 0, 16, false)).unwrap();
    let c = Channel::connect(&ledger.path("e"), soon()).unwrap();
    let ask = |seq, m: Message| {
        c.send(&Frame::new(seq, m).encode().unwrap(), &[], soon())
            .unwrap();
        Frame::decode(&c.recv(soon()).unwrap().bytes).unwrap()
    };
    let resolve = || Message::Resolve {
        names: vec!["a".into()],
    };
    assert!(matches!(
        ask(1, resolve()).message,
        Message::Refused {
            reason: Refusal::Unexpected,
            ..
        }
    ));
    assert!(matches!(
        ask(1, Message::Hello).message,
        Message::Welcome { .. }
    ));
    assert!(matches!(
        ask(2, resolve()).message,
        Message::Resolved { .. }
    ));
    let replayed = ask(2, resolve());
    assert_eq!(replayed.seq, 2);
    assert!(matches!(
        replayed.message,
        Message::Refused {
            reason: Refusal::OutOfOrder,
            ..
        }
    ));
    assert!(matches!(
        ask(3, Message::Hello).message,
        Message::Refused {
            reason: Refusal::Unexpected,
            ..
        }
    ));
    assert!(
        matches!(ask(3, resolve()).message, Message::Resolved { .. }),
        "a refused request does not use up its number"
    );
    assert_eq!(exp.figures().leases, 1, "one lease, however often asked");
}
