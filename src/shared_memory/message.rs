//! The messages between an exporter and its importers, one per packet of a `SOCK_SEQPACKET`
//! socket (descriptors ride beside the bytes, `SCM_RIGHTS`).
//!
//! A frame is a 16-byte header, then the body:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `RRSM` |
//! | 2 | protocol version ([`VERSION`]) |
//! | 1 | message kind |
//! | 1 | reserved, 0 |
//! | 4 | sequence number: an importer numbers its requests 1, 2, 3... (a refused request does not use its number up); a reply carries its request's, a refusal of a connection 0 |
//! | 4 | body length (at most [`MAX_BODY`]) |
//!
//! Integers are little-endian; text is a `u16` length and UTF-8 bytes; a list is a `u16` count
//! and its items. Every field has a limit ([`limits`]), checked by [`Frame::decode`] before
//! anything is allocated; a frame with bytes left over is refused.

use super::codec::{check_text, Reader, Writer};
use super::error::{Refusal, WireError};

/// The protocol version this process speaks.
pub const VERSION: u16 = 3;
/// The bytes a frame starts with.
pub const MAGIC: [u8; 4] = *b"RRSM";
/// The header's length.
pub const HEADER: usize = 16;
/// The longest body.
pub const MAX_BODY: usize = 64 << 10;
/// The longest frame.
pub const MAX_FRAME: usize = HEADER + MAX_BODY;

/// The limits of every field.
pub mod limits {
    /// The longest buffer name (bytes).
    pub const NAME: usize = 255;
    /// The longest dtype string (bytes): a NumPy type string such as `<f4`, or a name.
    pub const DTYPE: usize = 32;
    /// The most dimensions of a shape.
    pub const DIMS: usize = 16;
    /// The most names in one request or reply.
    pub const BATCH: usize = 128;
    /// The most segments (descriptors) in one message.
    pub const SEGMENTS: usize = 32;
    /// The longest detail of a refusal (bytes).
    pub const DETAIL: usize = 512;
}

/// A segment's number, given by its exporter.
pub type SegmentId = u32;

/// What stands behind a segment's descriptor, so an importer maps it the right way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// A memory file (`memfd_create`): host memory, mapped with `mmap`.
    Memfd,
    /// The CUDA driver's shareable handle of a `cuMemCreate` allocation, as a POSIX file
    /// descriptor: device memory, imported and mapped into a reserved device range.
    CudaFd,
}

impl SegmentKind {
    fn code(self) -> u8 {
        match self {
            SegmentKind::Memfd => 1,
            SegmentKind::CudaFd => 2,
        }
    }

    fn from_code(value: u8) -> Result<SegmentKind, WireError> {
        match value {
            1 => Ok(SegmentKind::Memfd),
            2 => Ok(SegmentKind::CudaFd),
            value => Err(WireError::Tag {
                what: "segment kind",
                value,
            }),
        }
    }
}

/// A segment as a message describes it; its descriptor travels beside the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Its number.
    pub id: SegmentId,
    /// Its length in bytes.
    pub size: u64,
    /// What stands behind it.
    pub kind: SegmentKind,
    /// Whether importers may write it (otherwise the descriptor is read-only where the kind
    /// allows, and importers map it read-only).
    pub writable: bool,
    /// Where it lies in its exporter's range, for an exporter that exports one range in
    /// segments (an expandable pool's pages: [`Message::Welcome`]'s `range`): importers map it
    /// at that offset of one range of their own, so consecutive segments lie at consecutive
    /// addresses there too. `None`: mapped wherever it fits.
    pub at: Option<u64>,
}

/// A named buffer: where it lies and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferSpec {
    /// The segment it lies in.
    pub segment: SegmentId,
    /// Its first byte in the segment.
    pub offset: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Its element type (a NumPy type string such as `<f4`, or a name; at most
    /// [`limits::DTYPE`] bytes, may be empty).
    pub dtype: String,
    /// Its shape (at most [`limits::DIMS`] dimensions).
    pub shape: Vec<u64>,
    /// Whether importers must not write it.
    pub readonly: bool,
}

impl BufferSpec {
    /// Checks the fields a peer cannot be trusted with: the dtype's text and the shape's
    /// length (the range is checked against the segment where the segment is known).
    ///
    /// # Errors
    /// The [`WireError`] of the first bad field.
    pub fn check(&self) -> Result<(), WireError> {
        check_text(&self.dtype, limits::DTYPE, true, "dtype")?;
        if self.shape.len() > limits::DIMS {
            return Err(WireError::Limit {
                what: "shape",
                max: limits::DIMS,
                got: self.shape.len(),
            });
        }
        Ok(())
    }

    /// Whether it lies within a segment of `segment_size` bytes.
    pub fn fits(&self, segment_size: u64) -> bool {
        self.offset
            .checked_add(self.size)
            .is_some_and(|end| end <= segment_size)
    }

    fn write(&self, w: &mut Writer) {
        w.u32(self.segment);
        w.u64(self.offset);
        w.u64(self.size);
        w.text(&self.dtype);
        w.count(self.shape.len());
        for &d in &self.shape {
            w.u64(d);
        }
        w.u8(u8::from(self.readonly));
    }

    fn read(r: &mut Reader<'_>) -> Result<BufferSpec, WireError> {
        let segment = r.u32("segment")?;
        let offset = r.u64("offset")?;
        let size = r.u64("size")?;
        let dtype = r.text(limits::DTYPE, true, "dtype")?;
        let dims = r.count(limits::DIMS, 8, "shape")?;
        let mut shape = Vec::with_capacity(dims);
        for _ in 0..dims {
            shape.push(r.u64("dimension")?);
        }
        let readonly = r.flag("readonly")?;
        Ok(BufferSpec {
            segment,
            offset,
            size,
            dtype,
            shape,
            readonly,
        })
    }
}

/// One name of a resolve's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The name is exported: here it is (and the importer holds a lease on it).
    Found {
        /// The name.
        name: String,
        /// The buffer.
        spec: BufferSpec,
    },
    /// No buffer of that name is exported.
    Unknown {
        /// The name.
        name: String,
    },
}

impl Entry {
    /// The name it answers.
    pub fn name(&self) -> &str {
        match self {
            Entry::Found { name, .. } | Entry::Unknown { name } => name,
        }
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// An importer's greeting (its first request).
    Hello,
    /// The exporter's answer to the greeting.
    Welcome {
        /// The exporter's process id (in its own pid namespace).
        pid: u32,
        /// How many names it exports now.
        names: u32,
        /// The bytes of the range its placed segments lie in ([`SegmentInfo::at`]); 0 when it
        /// has none.
        range: u64,
    },
    /// Resolve these names (and take a lease on each one exported).
    Resolve {
        /// The names.
        names: Vec<String>,
    },
    /// The answer to a resolve: the first names asked, in order (fewer than asked when the
    /// answer's segments or bytes would pass their limits: ask again for the rest; none when
    /// the first name lies in more new segments than one answer carries: then the answer
    /// carries segments only, at least one); each segment new to this importer is described
    /// here, its descriptor beside, in order. A buffer of an exporter with a range
    /// ([`SegmentInfo::at`]) may run past its first segment into the next ones; they come in
    /// this answer or an earlier one.
    Resolved {
        /// Segments this importer has not received before.
        segments: Vec<SegmentInfo>,
        /// The answers, in the order asked.
        entries: Vec<Entry>,
    },
    /// Let go of these names' leases.
    Release {
        /// The names.
        names: Vec<String>,
    },
    /// How many leases a release let go.
    Released {
        /// The count.
        count: u32,
    },
    /// The exported names after `after` (empty: from the first), in order.
    List {
        /// The last name the importer has.
        after: String,
    },
    /// A page of names.
    Names {
        /// The names.
        names: Vec<String>,
        /// Whether more follow.
        more: bool,
    },
    /// A request refused.
    Refused {
        /// Why.
        reason: Refusal,
        /// In words.
        detail: String,
    },
    /// Take these segments and names (an importer hands back what it maps to a new exporter);
    /// the segments' descriptors ride beside, in order. Buffers name segments by the numbers
    /// the importer knows them by (from the exporter that died), in this or an earlier adopt.
    /// Placed segments ([`SegmentInfo::at`]) keep their places in a range of `range` bytes
    /// (the dead exporter's, [`Message::Welcome`]'s), so that a buffer across them stays
    /// contiguous.
    Adopt {
        /// The bytes of the range the placed segments lie in (0: none is placed).
        range: u64,
        /// The segments.
        segments: Vec<SegmentInfo>,
        /// The names and their buffers.
        buffers: Vec<(String, BufferSpec)>,
    },
    /// What an adopt took.
    Adopted {
        /// The segments taken: the importer's number of each and this exporter's.
        segments: Vec<(SegmentId, SegmentId)>,
        /// Names exported again.
        names: u32,
    },
}

/// The kinds' codes.
mod kind {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const RESOLVE: u8 = 3;
    pub const RESOLVED: u8 = 4;
    pub const RELEASE: u8 = 5;
    pub const RELEASED: u8 = 6;
    pub const LIST: u8 = 7;
    pub const NAMES: u8 = 8;
    pub const REFUSED: u8 = 9;
    pub const ADOPT: u8 = 10;
    pub const ADOPTED: u8 = 11;
}

/// The smallest encoded segment (id, size, kind, writable, no place).
const MIN_SEGMENT: usize = 4 + 8 + 1 + 1 + 1;
/// The smallest encoded buffer (segment, offset, size, empty dtype, no shape, readonly).
const MIN_BUFFER: usize = 4 + 8 + 8 + 2 + 2 + 1;

fn write_names(w: &mut Writer, names: &[String]) {
    w.count(names.len());
    for n in names {
        w.text(n);
    }
}

fn read_names(r: &mut Reader<'_>) -> Result<Vec<String>, WireError> {
    let n = r.count(limits::BATCH, 3, "names")?;
    let mut names = Vec::with_capacity(n);
    for _ in 0..n {
        names.push(r.text(limits::NAME, false, "name")?);
    }
    Ok(names)
}

fn write_segments(w: &mut Writer, segments: &[SegmentInfo]) {
    w.count(segments.len());
    for s in segments {
        w.u32(s.id);
        w.u64(s.size);
        w.u8(s.kind.code());
        w.u8(u8::from(s.writable));
        w.u8(u8::from(s.at.is_some()));
        if let Some(at) = s.at {
            w.u64(at);
        }
    }
}

fn read_segments(r: &mut Reader<'_>) -> Result<Vec<SegmentInfo>, WireError> {
    let n = r.count(limits::SEGMENTS, MIN_SEGMENT, "segments")?;
    let mut segments = Vec::with_capacity(n);
    for _ in 0..n {
        segments.push(SegmentInfo {
            id: r.u32("segment id")?,
            size: r.u64("segment size")?,
            kind: SegmentKind::from_code(r.u8("segment kind")?)?,
            writable: r.flag("segment writable")?,
            at: match r.flag("segment placed")? {
                true => Some(r.u64("segment place")?),
                false => None,
            },
        });
    }
    Ok(segments)
}

impl Message {
    /// The code of its kind.
    fn kind(&self) -> u8 {
        match self {
            Message::Hello => kind::HELLO,
            Message::Welcome { .. } => kind::WELCOME,
            Message::Resolve { .. } => kind::RESOLVE,
            Message::Resolved { .. } => kind::RESOLVED,
            Message::Release { .. } => kind::RELEASE,
            Message::Released { .. } => kind::RELEASED,
            Message::List { .. } => kind::LIST,
            Message::Names { .. } => kind::NAMES,
            Message::Refused { .. } => kind::REFUSED,
            Message::Adopt { .. } => kind::ADOPT,
            Message::Adopted { .. } => kind::ADOPTED,
        }
    }

    /// How many descriptors ride beside it.
    pub fn descriptors(&self) -> usize {
        match self {
            Message::Resolved { segments, .. } | Message::Adopt { segments, .. } => segments.len(),
            _ => 0,
        }
    }

    fn write_body(&self, w: &mut Writer) {
        match self {
            Message::Hello => {}
            Message::Welcome { pid, names, range } => {
                w.u32(*pid);
                w.u32(*names);
                w.u64(*range);
            }
            Message::Resolve { names } | Message::Release { names } => write_names(w, names),
            Message::Resolved { segments, entries } => {
                write_segments(w, segments);
                w.count(entries.len());
                for e in entries {
                    match e {
                        Entry::Found { name, spec } => {
                            w.u8(1);
                            w.text(name);
                            spec.write(w);
                        }
                        Entry::Unknown { name } => {
                            w.u8(0);
                            w.text(name);
                        }
                    }
                }
            }
            Message::Released { count } => w.u32(*count),
            Message::List { after } => w.text(after),
            Message::Names { names, more } => {
                write_names(w, names);
                w.u8(u8::from(*more));
            }
            Message::Refused { reason, detail } => {
                w.u8(reason.code());
                w.text(detail);
            }
            Message::Adopt {
                range,
                segments,
                buffers,
            } => {
                w.u64(*range);
                write_segments(w, segments);
                w.count(buffers.len());
                for (name, spec) in buffers {
                    w.text(name);
                    spec.write(w);
                }
            }
            Message::Adopted { segments, names } => {
                w.count(segments.len());
                for &(old, new) in segments {
                    w.u32(old);
                    w.u32(new);
                }
                w.u32(*names);
            }
        }
    }

    fn read_body(kind: u8, r: &mut Reader<'_>) -> Result<Message, WireError> {
        Ok(match kind {
            kind::HELLO => Message::Hello,
            kind::WELCOME => Message::Welcome {
                pid: r.u32("pid")?,
                names: r.u32("names")?,
                range: r.u64("range")?,
            },
            kind::RESOLVE => Message::Resolve {
                names: read_names(r)?,
            },
            kind::RELEASE => Message::Release {
                names: read_names(r)?,
            },
            kind::RESOLVED => {
                let segments = read_segments(r)?;
                let n = r.count(limits::BATCH, 4, "entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let found = r.flag("entry")?;
                    let name = r.text(limits::NAME, false, "name")?;
                    entries.push(if found {
                        let spec = BufferSpec::read(r)?;
                        Entry::Found { name, spec }
                    } else {
                        Entry::Unknown { name }
                    });
                }
                Message::Resolved { segments, entries }
            }
            kind::RELEASED => Message::Released {
                count: r.u32("count")?,
            },
            kind::LIST => Message::List {
                after: r.text(limits::NAME, true, "after")?,
            },
            kind::NAMES => Message::Names {
                names: read_names(r)?,
                more: r.flag("more")?,
            },
            kind::REFUSED => Message::Refused {
                reason: Refusal::from_code(r.u8("refusal")?)?,
                detail: r.text(limits::DETAIL, true, "detail")?,
            },
            kind::ADOPT => {
                let range = r.u64("range")?;
                let segments = read_segments(r)?;
                let n = r.count(limits::BATCH, 3 + MIN_BUFFER, "buffers")?;
                let mut buffers = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.text(limits::NAME, false, "name")?;
                    buffers.push((name, BufferSpec::read(r)?));
                }
                Message::Adopt {
                    range,
                    segments,
                    buffers,
                }
            }
            kind::ADOPTED => {
                let n = r.count(limits::SEGMENTS, 8, "segments")?;
                let mut segments = Vec::with_capacity(n);
                for _ in 0..n {
                    segments.push((r.u32("old segment")?, r.u32("new segment")?));
                }
                Message::Adopted {
                    segments,
                    names: r.u32("names")?,
                }
            }
            other => return Err(WireError::Kind(other)),
        })
    }
}

/// A message with its sequence number: what one packet carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The request's number (a reply carries its request's).
    pub seq: u32,
    /// The message.
    pub message: Message,
}

impl Frame {
    /// A frame.
    pub fn new(seq: u32, message: Message) -> Frame {
        Frame { seq, message }
    }

    /// Its bytes.
    ///
    /// # Errors
    /// [`WireError::Limit`] when the body would pass [`MAX_BODY`] (the caller sent lists past
    /// their limits).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut body = Writer::new();
        self.message.write_body(&mut body);
        let body = body.into_bytes();
        if body.len() > MAX_BODY {
            return Err(WireError::Limit {
                what: "body",
                max: MAX_BODY,
                got: body.len(),
            });
        }
        let mut w = Writer::new();
        for b in MAGIC {
            w.u8(b);
        }
        w.u16(VERSION);
        w.u8(self.message.kind());
        w.u8(0);
        w.u32(self.seq);
        w.u32(body.len() as u32);
        let mut bytes = w.into_bytes();
        bytes.extend_from_slice(&body);
        Ok(bytes)
    }

    /// The sequence number of a frame whose body may be bad, when its header is whole (to
    /// number the refusal).
    pub fn seq_of(bytes: &[u8]) -> Option<u32> {
        let b = bytes.get(8..12)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The frame in one packet's bytes.
    ///
    /// # Errors
    /// The [`WireError`] of the first thing wrong: a bad header, a length that is not the
    /// packet's, a field past its limit or cut short, bytes left over.
    ///
    /// # Time Complexity
    /// O(bytes): each byte is read once.
    pub fn decode(bytes: &[u8]) -> Result<Frame, WireError> {
        let mut r = Reader::new(bytes);
        if r.take(4, "magic")? != MAGIC {
            return Err(WireError::Magic);
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        let kind = r.u8("kind")?;
        let flags = r.u8("flags")?;
        if flags != 0 {
            return Err(WireError::Flags(flags));
        }
        let seq = r.u32("seq")?;
        let declared = r.u32("length")? as usize;
        if declared > MAX_BODY {
            return Err(WireError::Limit {
                what: "body",
                max: MAX_BODY,
                got: declared,
            });
        }
        if declared != r.left() {
            return Err(WireError::Length {
                declared,
                actual: r.left(),
            });
        }
        let message = Message::read_body(kind, &mut r)?;
        r.finish()?;
        Ok(Frame { seq, message })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn spec(segment: SegmentId, offset: u64, size: u64) -> BufferSpec {
        BufferSpec {
            segment,
            offset,
            size,
            dtype: "<f4".into(),
            shape: vec![size / 4],
            readonly: false,
        }
    }

    pub(crate) fn every_kind() -> Vec<Message> {
        let seg = SegmentInfo {
            id: 3,
            size: 1 << 21,
            kind: SegmentKind::Memfd,
            writable: true,
            at: None,
        };
        vec![
            Message::Hello,
            Message::Welcome {
                pid: 7,
                names: 2,
                range: 1 << 30,
            },
            Message::Resolve {
                names: vec!["a".into(), "b".into()],
            },
            Message::Resolved {
                segments: vec![seg.clone()],
                entries: vec![
                    Entry::Found {
                        name: "a".into(),
                        spec: spec(3, 0, 64),
                    },
                    Entry::Unknown { name: "b".into() },
                ],
            },
            Message::Release {
                names: vec!["a".into()],
            },
            Message::Released { count: 1 },
            Message::List { after: "".into() },
            Message::Names {
                names: vec!["a".into()],
                more: false,
            },
            Message::Refused {
                reason: Refusal::OutOfOrder,
                detail: "seq 3, expected 2".into(),
            },
            Message::Adopt {
                range: 1 << 30,
                segments: vec![SegmentInfo {
                    kind: SegmentKind::CudaFd,
                    writable: false,
                    at: Some(1 << 25),
                    ..seg
                }],
                buffers: vec![("a".into(), spec(3, 64, 64))],
            },
            Message::Adopted {
                segments: vec![(3, 1)],
                names: 1,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for (i, m) in every_kind().into_iter().enumerate() {
            let frame = Frame::new(i as u32 + 1, m);
            let bytes = frame.encode().unwrap();
            assert_eq!(Frame::seq_of(&bytes), Some(frame.seq));
            assert_eq!(Frame::decode(&bytes), Ok(frame));
        }
    }

    #[test]
    fn bad_headers_are_refused_with_their_reason() {
        let good = Frame::new(1, Message::Hello).encode().unwrap();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(Frame::decode(&bad), Err(WireError::Magic));
        let mut bad = good.clone();
        bad[4] = 9;
        assert_eq!(Frame::decode(&bad), Err(WireError::Version(9)));
        let mut bad = good.clone();
        bad[6] = 99;
        assert_eq!(Frame::decode(&bad), Err(WireError::Kind(99)));
        let mut bad = good.clone();
        bad[7] = 1;
        assert_eq!(Frame::decode(&bad), Err(WireError::Flags(1)));
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(Frame::decode(&bad), Err(WireError::Length { .. })));
        let mut bad = good.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Frame::decode(&bad), Err(WireError::Limit { .. })));
        assert!(matches!(
            Frame::decode(&good[..10]),
            Err(WireError::Truncated { .. })
        ));
        // A welcome with a byte more in its body (and the length to match): trailing.
        let mut long = Frame::new(1, Message::Released { count: 1 })
            .encode()
            .unwrap();
        long.push(0);
        long[12..16].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(Frame::decode(&long), Err(WireError::Trailing(1)));
    }

    #[test]
    fn a_body_past_the_limit_is_not_encoded() {
        let names = vec!["n".repeat(limits::NAME); 300];
        assert!(Frame::new(1, Message::Resolve { names }).encode().is_err());
        // Lists within their limits always fit.
        let names = vec!["n".repeat(limits::NAME); limits::BATCH];
        let entries = names
            .iter()
            .map(|name| Entry::Found {
                name: name.clone(),
                spec: BufferSpec {
                    dtype: "d".repeat(limits::DTYPE),
                    shape: vec![u64::MAX; limits::DIMS],
                    ..spec(0, 0, 0)
                },
            })
            .collect();
        let segments = (0..limits::SEGMENTS as u32)
            .map(|id| SegmentInfo {
                id,
                size: 1,
                kind: SegmentKind::Memfd,
                writable: true,
                at: Some(u64::MAX),
            })
            .collect();
        let m = Message::Resolved { segments, entries };
        let bytes = Frame::new(1, m.clone()).encode().unwrap();
        assert_eq!(Frame::decode(&bytes).unwrap().message, m);
    }

    fn any_text(max: usize) -> impl Strategy<Value = String> {
        proptest::string::string_regex(&format!("[a-z0-9_./<>-]{{1,{max}}}")).unwrap()
    }

    fn any_spec() -> impl Strategy<Value = BufferSpec> {
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            proptest::string::string_regex("[<>|a-z0-9]{0,8}").unwrap(),
            prop::collection::vec(any::<u64>(), 0..4),
            any::<bool>(),
        )
            .prop_map(
                |(segment, offset, size, dtype, shape, readonly)| BufferSpec {
                    segment,
                    offset,
                    size,
                    dtype,
                    shape,
                    readonly,
                },
            )
    }

    pub(crate) fn any_message() -> impl Strategy<Value = Message> {
        let names = || prop::collection::vec(any_text(20), 0..6);
        prop_oneof![
            Just(Message::Hello),
            (any::<u32>(), any::<u32>(), any::<u64>())
                .prop_map(|(pid, names, range)| Message::Welcome { pid, names, range }),
            names().prop_map(|names| Message::Resolve { names }),
            names().prop_map(|names| Message::Release { names }),
            prop::collection::vec((any_text(20), proptest::option::of(any_spec())), 0..4).prop_map(
                |entries| Message::Resolved {
                    segments: vec![],
                    entries: entries
                        .into_iter()
                        .map(|(name, spec)| match spec {
                            Some(spec) => Entry::Found { name, spec },
                            None => Entry::Unknown { name },
                        })
                        .collect(),
                }
            ),
            any::<u32>().prop_map(|count| Message::Released { count }),
            any_text(20).prop_map(|after| Message::List { after }),
            (names(), any::<bool>()).prop_map(|(names, more)| Message::Names { names, more }),
            (
                any::<u64>(),
                prop::collection::vec((any_text(20), any_spec()), 0..4)
            )
                .prop_map(|(range, buffers)| Message::Adopt {
                    range,
                    segments: vec![],
                    buffers,
                }),
        ]
    }

    proptest! {
        #[test]
        fn random_messages_round_trip(seq in any::<u32>(), m in any_message()) {
            let frame = Frame::new(seq, m);
            let bytes = frame.encode().unwrap();
            prop_assert_eq!(Frame::decode(&bytes), Ok(frame));
        }

        /// Any bytes: a frame or a refusal, never a panic.
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = Frame::decode(&bytes);
        }

        /// A good frame cut short, or with a byte changed: a frame (the change was in a value)
        /// or a refusal, never a panic; cut short, always a refusal.
        #[test]
        fn truncated_or_corrupted_frames_are_refused(
            m in any_message(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let bytes = Frame::new(1, m).encode().unwrap();
            let cut = cut.index(bytes.len());
            prop_assert!(Frame::decode(&bytes[..cut]).is_err());
            let mut corrupted = bytes.clone();
            corrupted[flip.index(bytes.len())] = byte;
            if let Ok(frame) = Frame::decode(&corrupted) {
                // Whatever decodes re-encodes to the same bytes: nothing was read twice or
                // skipped.
                prop_assert_eq!(frame.encode().unwrap(), corrupted);
            }
        }
    }
}
