//! [`Attachment`]: an importer's view of one exporter: the segments it maps (each once) and the
//! names it resolved.
//!
//! Nothing an exporter sends is trusted: an answer must carry the request's number and answer
//! the names asked, in order; each segment comes once, with exactly one descriptor, and is
//! checked as its kind requires before it is mapped ([`super::segment::map`]); a buffer must lie
//! within its segment. Every wait on the exporter has a deadline. When the exporter dies, what
//! was mapped stays mapped (the descriptors keep the memory), and the names resolved before
//! still resolve.

use super::error::ShareError;
use super::memfd::HostMap;
use super::message::{limits, BufferSpec, Entry, Frame, Message, SegmentId, SegmentInfo};
use super::segment::{self, PlacedRange, ShareableSegment};
use super::transport::{Channel, Packet};
use crate::shared_gpu::ledger_dir::LedgerDir;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A name as an importer resolved it: where the buffer is in this process and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name.
    pub name: String,
    /// Its address in this process (a host address for a memory file's segment, a device
    /// address for device memory).
    pub addr: usize,
    /// Its length in bytes.
    pub size: u64,
    /// Its element type as exported.
    pub dtype: String,
    /// Its shape as exported.
    pub shape: Vec<u64>,
    /// Whether this process must not write it (exported read-only, or in a segment mapped
    /// read-only).
    pub readonly: bool,
    /// The segment it lies in, and where.
    pub segment: SegmentId,
    /// Its first byte in the segment.
    pub offset: u64,
    /// Whether the CPU can read it at `addr`.
    pub host: bool,
}

/// How an importer waits.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The longest wait for one answer of the exporter.
    pub timeout: Duration,
}

impl Default for AttachOptions {
    fn default() -> AttachOptions {
        AttachOptions {
            timeout: Duration::from_secs(5),
        }
    }
}

/// The most names a listing takes (an exporter that pages on for ever is refused).
const MAX_LISTED: usize = 1 << 20;

/// One mapped segment and what the exporter said of it.
#[derive(Debug)]
struct Held {
    info: SegmentInfo,
    map: Box<dyn ShareableSegment>,
    /// Whether this process maps it writable now: a pool's page is mapped read-only until a
    /// writable name on it is resolved ([`Attachment::read_only_segments`]).
    write_mapped: bool,
}

/// An importer attached to one exporter. Dropping it closes the socket (the exporter lets go
/// of its leases) and unmaps its segments.
#[derive(Debug)]
pub struct Attachment {
    channel: Channel,
    path: PathBuf,
    seq: u32,
    exporter_pid: u32,
    timeout: Duration,
    gone: bool,
    segments: HashMap<SegmentId, Held>,
    /// Segments a new exporter did not take (an adoption): still mapped, no longer named.
    orphans: Vec<Held>,
    resolved: BTreeMap<String, BufferSpec>,
    /// The bytes of the exporter's range its placed segments lie in (0: it has none).
    range_size: u64,
    /// This process's range for the exporter's placed segments, reserved at the first one.
    placed: Option<PlacedRange>,
    /// The placed segments by where they lie in the exporter's range.
    occupied: BTreeMap<u64, SegmentId>,
    /// Places in the range that segments a new exporter did not take still map (adoption):
    /// where, and their bytes.
    orphan_places: BTreeMap<u64, u64>,
}

impl Attachment {
    /// Attaches to the exporter at `path`: connects, checks it is this user's, greets it.
    ///
    /// # Errors
    /// [`ShareError::Gone`] when no exporter listens there; [`ShareError::PeerUser`];
    /// [`ShareError::Refused`] (busy); [`ShareError::Timeout`].
    pub fn attach(path: &Path, options: AttachOptions) -> Result<Attachment, ShareError> {
        let channel = Channel::connect(path, Instant::now() + options.timeout)?;
        let mut attachment = Attachment {
            channel,
            path: path.to_path_buf(),
            seq: 0,
            exporter_pid: 0,
            timeout: options.timeout,
            gone: false,
            segments: HashMap::new(),
            orphans: Vec::new(),
            resolved: BTreeMap::new(),
            range_size: 0,
            placed: None,
            occupied: BTreeMap::new(),
            orphan_places: BTreeMap::new(),
        };
        attachment.greet()?;
        Ok(attachment)
    }

    /// Attaches to the exporter named `name` in the ledger directory `dir`.
    ///
    /// # Errors
    /// As [`Attachment::attach`]; [`ShareError::Invalid`] for a name that cannot name one.
    pub fn in_ledger(
        dir: &LedgerDir,
        name: &str,
        options: AttachOptions,
    ) -> Result<Attachment, ShareError> {
        Attachment::attach(&super::socket_path(dir, name)?, options)
    }

    fn greet(&mut self) -> Result<(), ShareError> {
        match self.request(Message::Hello, &[])?.0 {
            Message::Welcome { pid, range, .. } => {
                self.exporter_pid = pid;
                self.range_size = range;
                Ok(())
            }
            other => Err(unexpected("a welcome", &other)),
        }
    }

    /// The exporter's socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The exporter's process id, as it said (in its pid namespace).
    pub fn exporter_pid(&self) -> u32 {
        self.exporter_pid
    }

    /// Whether the exporter is known to be gone (its socket closed).
    pub fn exporter_gone(&self) -> bool {
        self.gone
    }

    /// How many segments this process maps.
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Sends one request (with `fds` beside it) and waits for its answer and the descriptors
    /// beside that; a refusal is an error. Answers to earlier requests that timed out are
    /// skipped.
    fn request(
        &mut self,
        message: Message,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Message, Packet), ShareError> {
        if self.gone {
            return Err(ShareError::Gone);
        }
        self.seq = self.seq.wrapping_add(1);
        let bytes = Frame::new(self.seq, message).encode()?;
        let deadline = Instant::now() + self.timeout;
        let outcome = match self.channel.send(&bytes, fds, deadline) {
            // An exporter that refused this connection (busy) closed it after saying so: its
            // last word is still there to read.
            Err(ShareError::Gone) => self.answer(0, Instant::now()),
            Err(e) => Err(e),
            Ok(()) => self.answer(self.seq, deadline),
        };
        if matches!(outcome, Err(ShareError::Gone)) {
            self.gone = true;
        }
        outcome
    }

    /// The answer numbered `seq` (skipping answers to earlier requests), or a refusal,
    /// waiting until `deadline`.
    fn answer(&self, seq: u32, deadline: Instant) -> Result<(Message, Packet), ShareError> {
        loop {
            let packet = self.channel.recv(deadline).map_err(|e| match e {
                ShareError::Timeout(_) if seq == 0 => ShareError::Gone,
                e => e,
            })?;
            let frame = Frame::decode(&packet.bytes)?;
            match frame.message {
                Message::Refused { reason, detail } if frame.seq == seq || frame.seq == 0 => {
                    return Err(ShareError::Refused { reason, detail })
                }
                m if frame.seq == seq => return Ok((m, packet)),
                _ if frame.seq < seq => continue,
                m => return Err(unexpected("the answer to the request sent", &m)),
            }
        }
    }

    /// Resolves `name` (see [`Attachment::resolve_many`]).
    ///
    /// # Errors
    /// As [`Attachment::resolve_many`].
    pub fn resolve(&mut self, name: &str) -> Result<Resolved, ShareError> {
        let mut all = self.resolve_many(&[name])?;
        all.pop()
            .ok_or_else(|| ShareError::Protocol("no answer for the name".into()))
    }

    /// Resolves `names`, in order: a name resolved before answers from what this process
    /// holds (also once the exporter is gone); the others are asked of the exporter, which
    /// gives a lease on each, and the segments they lie in are mapped (each once).
    ///
    /// # Errors
    /// [`ShareError::UnknownName`] for the first name not exported (the names before it stay
    /// resolved); [`ShareError::Protocol`] for an answer that breaks the protocol; a segment
    /// that cannot be mapped ([`segment::map`]); [`ShareError::Gone`] or
    /// [`ShareError::Timeout`] when the exporter does not answer.
    pub fn resolve_many(&mut self, names: &[&str]) -> Result<Vec<Resolved>, ShareError> {
        let mut asked: Vec<String> = Vec::new();
        // A name asked twice is asked once (a set: thousands of names in one call).
        let mut seen: HashSet<&str> = HashSet::with_capacity(names.len());
        for &name in names {
            if !self.resolved.contains_key(name) && seen.insert(name) {
                super::codec::check_text(name, limits::NAME, false, "name")
                    .map_err(|e| ShareError::invalid("name", e.to_string()))?;
                asked.push(name.to_string());
            }
        }
        let mut unknown = None;
        let mut rest: &[String] = &asked;
        while !rest.is_empty() {
            let batch = &rest[..rest.len().min(limits::BATCH)];
            let answered = self.ask_resolve(batch, &mut unknown)?;
            rest = &rest[answered..];
        }
        if let Some(name) = unknown {
            return Err(ShareError::UnknownName(name));
        }
        names.iter().map(|name| self.resolved_here(name)).collect()
    }

    /// Asks the exporter to resolve `batch`; how many of its first names were answered.
    fn ask_resolve(
        &mut self,
        batch: &[String],
        unknown: &mut Option<String>,
    ) -> Result<usize, ShareError> {
        let (answer, packet) = self.request(
            Message::Resolve {
                names: batch.to_vec(),
            },
            &[],
        )?;
        let Message::Resolved { segments, entries } = answer else {
            return Err(unexpected("a resolve's answer", &answer));
        };
        // Segments alone (a name in more new segments than one answer carries) make progress:
        // each segment comes once.
        if (entries.is_empty() && segments.is_empty()) || entries.len() > batch.len() {
            return Err(ShareError::Protocol(format!(
                "{} answers to {} names",
                entries.len(),
                batch.len()
            )));
        }
        if let Some((e, asked)) = entries
            .iter()
            .zip(batch)
            .find(|(e, asked)| e.name() != asked.as_str())
        {
            return Err(ShareError::Protocol(format!(
                "answered {:?} for {asked:?}",
                e.name()
            )));
        }
        let writes = self.written_spans(&segments, &entries);
        self.map_segments(segments, packet.fds, packet.fds_cut, &writes)?;
        let count = entries.len();
        for entry in entries {
            match entry {
                Entry::Found { name, spec } => {
                    self.check_buffer(&spec)?;
                    if !spec.readonly {
                        self.map_writable(&spec)?;
                    }
                    self.resolved.insert(name, spec);
                }
                Entry::Unknown { name } => {
                    unknown.get_or_insert(name);
                }
            }
        }
        Ok(count)
    }

    /// Where the writable buffers of an answer lie in the exporter's range (placed segments
    /// only), as `start .. end` sorted: the new pages they touch are mapped writable at once.
    fn written_spans(&self, infos: &[SegmentInfo], entries: &[Entry]) -> Vec<(u64, u64)> {
        let at_of = |id: SegmentId| {
            infos
                .iter()
                .find(|i| i.id == id)
                .map_or_else(|| self.segments.get(&id).and_then(|h| h.info.at), |i| i.at)
        };
        let mut spans: Vec<(u64, u64)> = entries
            .iter()
            .filter_map(|e| match e {
                Entry::Found { spec, .. } if !spec.readonly => {
                    let start = at_of(spec.segment)?.checked_add(spec.offset)?;
                    Some((start, start.checked_add(spec.size)?))
                }
                _ => None,
            })
            .collect();
        spans.sort_unstable();
        spans
    }

    /// Maps each segment new to this process, from its descriptor: a pool's page read-only
    /// unless a writable buffer of `writes` (sorted spans in the exporter's range) lies on it.
    fn map_segments(
        &mut self,
        infos: Vec<SegmentInfo>,
        fds: Vec<OwnedFd>,
        cut: bool,
        writes: &[(u64, u64)],
    ) -> Result<(), ShareError> {
        if cut || infos.len() != fds.len() {
            return Err(ShareError::Protocol(format!(
                "{} segments with {} descriptors{}",
                infos.len(),
                fds.len(),
                if cut { " (cut)" } else { "" }
            )));
        }
        if let Some(dup) = infos.iter().find(|i| self.segments.contains_key(&i.id)) {
            return Err(ShareError::Protocol(format!(
                "segment {} sent again (it is mapped once)",
                dup.id
            )));
        }
        for (info, fd) in infos.into_iter().zip(fds) {
            let (map, write_mapped) = match info.at {
                // A pool's page: read-only until a writable name on it is resolved.
                Some(at) => {
                    let map = self.place(&info, fd, at)?;
                    let end = at.saturating_add(info.size);
                    // The spans starting before this page ends: does one end inside or past it?
                    let before = writes.partition_point(|&(start, _)| start < end);
                    let written = writes[..before].iter().any(|&(_, e)| e > at);
                    let protected = info.writable && !written && map.protect()?;
                    (map, info.writable && !protected)
                }
                None => (segment::map(&info, fd)?, info.writable),
            };
            self.segments.insert(
                info.id,
                Held {
                    info,
                    map,
                    write_mapped,
                },
            );
        }
        Ok(())
    }

    /// Maps writable the segments a writable buffer lies in that are mapped read-only here.
    fn map_writable(&mut self, spec: &BufferSpec) -> Result<(), ShareError> {
        let ids: Vec<SegmentId> = self
            .pieces(spec)?
            .iter()
            .filter(|(held, _, _)| !held.write_mapped && held.info.writable)
            .map(|(held, _, _)| held.info.id)
            .collect();
        for id in ids {
            if let Some(held) = self.segments.get_mut(&id) {
                held.map.allow_writes()?;
                held.write_mapped = true;
            }
        }
        Ok(())
    }

    /// The runs of a pool's pages this process maps side by side, as (first address, bytes),
    /// in address order: every buffer of a pool lies in one of them. The addresses between
    /// runs are reserved here, not mapped (pages this process resolved no name on).
    pub fn placed_runs(&self) -> Vec<(usize, usize)> {
        let Some(range) = &self.placed else {
            return Vec::new();
        };
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (&at, id) in &self.occupied {
            let Some(held) = self.segments.get(id) else {
                continue;
            };
            let (start, len) = (range.base() + at as usize, held.info.size as usize);
            match runs.last_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => runs.push((start, len)),
            }
        }
        runs
    }

    /// How many segments this process maps read-only now (a write there faults): those the
    /// exporter exports read-only, and a pool's pages that carry only read-only names this
    /// process resolved (where the driver can protect them).
    pub fn read_only_segments(&self) -> usize {
        self.segments.values().filter(|h| !h.write_mapped).count()
    }

    /// Maps a placed segment at its place in this process's range for the exporter (reserved
    /// at the first one), after checking that the place lies in the exporter's range and holds
    /// no other segment.
    fn place(
        &mut self,
        info: &SegmentInfo,
        fd: OwnedFd,
        at: u64,
    ) -> Result<Box<dyn ShareableSegment>, ShareError> {
        if self.range_size == 0 {
            // The exporter had no pool's pages at the greeting (it adopted some since).
            return Err(ShareError::Protocol(format!(
                "a pool's page (segment {}) from an exporter that had none when this process \
                 attached (it adopted them since): attach again to map them",
                info.id
            )));
        }
        let end = at.checked_add(info.size);
        if end.map_or(true, |e| e > self.range_size) || info.size == 0 {
            return Err(ShareError::Protocol(format!(
                "a segment of {} bytes at {at} in a range of {}",
                info.size, self.range_size
            )));
        }
        let end = at + info.size;
        let before = self.occupied.range(..end).next_back();
        if let Some((&start, id)) = before {
            let held_end = start + self.segments.get(id).map_or(0, |h| h.info.size);
            if held_end > at {
                return Err(ShareError::Protocol(format!(
                    "a segment at {at} overlaps segment {id} at {start}"
                )));
            }
        }
        if let Some((&start, &size)) = self.orphan_places.range(..end).next_back() {
            if start + size > at {
                return Err(ShareError::Protocol(format!(
                    "a segment at {at} overlaps one at {start} the exporter did not adopt"
                )));
            }
        }
        let range = match &self.placed {
            Some(range) => range.clone(),
            None => {
                let range = PlacedRange::reserve(info.kind, self.range_size)?;
                self.placed = Some(range.clone());
                range
            }
        };
        let map = segment::place(info, fd, &range, at)?;
        self.occupied.insert(at, info.id);
        Ok(map)
    }

    /// The segments `spec` lies in, with the part of it in each: (segment, offset in it,
    /// bytes); one for a segment on its own, the run of placed segments it crosses otherwise.
    fn pieces(&self, spec: &BufferSpec) -> Result<Vec<(&Held, u64, u64)>, ShareError> {
        let first = self.segments.get(&spec.segment).ok_or_else(|| {
            ShareError::Protocol(format!(
                "a buffer in segment {}, which was never sent",
                spec.segment
            ))
        })?;
        let outside = || {
            ShareError::Protocol(format!(
                "{} bytes at {} pass segment {}'s {} bytes",
                spec.size, spec.offset, spec.segment, first.info.size
            ))
        };
        let Some(at) = first.info.at.filter(|_| !spec.fits(first.info.size)) else {
            return match spec.fits(first.info.size) {
                true => Ok(vec![(first, spec.offset, spec.size)]),
                false => Err(outside()),
            };
        };
        // A placed buffer past its first segment: the segments after it, one after the other.
        let start = at.checked_add(spec.offset).ok_or_else(outside)?;
        let end = start.checked_add(spec.size).ok_or_else(outside)?;
        let mut pieces = Vec::new();
        let mut pos = start;
        let mut seg_at = at;
        let mut held = first;
        loop {
            let seg_end = seg_at + held.info.size;
            let take = seg_end.min(end) - pos;
            pieces.push((held, pos - seg_at, take));
            pos += take;
            if pos == end {
                return Ok(pieces);
            }
            held = self
                .occupied
                .get(&seg_end)
                .and_then(|id| self.segments.get(id))
                .ok_or_else(|| {
                    ShareError::Protocol(format!(
                        "a buffer runs past segment {} at {seg_at} into no segment sent",
                        spec.segment
                    ))
                })?;
            seg_at = seg_end;
        }
    }

    /// Checks that `spec` lies within a segment this process maps, or a run of placed
    /// segments one after the other.
    fn check_buffer(&self, spec: &BufferSpec) -> Result<(), ShareError> {
        spec.check()?;
        self.pieces(spec).map(drop)
    }

    /// A name resolved before, from what this process holds.
    fn resolved_here(&self, name: &str) -> Result<Resolved, ShareError> {
        let spec = self
            .resolved
            .get(name)
            .ok_or_else(|| ShareError::UnknownName(name.to_string()))?;
        let held = self
            .segments
            .get(&spec.segment)
            .ok_or_else(|| ShareError::Protocol("a resolved buffer's segment is gone".into()))?;
        Ok(Resolved {
            name: name.to_string(),
            addr: held.map.base() + spec.offset as usize,
            size: spec.size,
            dtype: spec.dtype.clone(),
            shape: spec.shape.clone(),
            readonly: spec.readonly || !held.map.writable(),
            segment: spec.segment,
            offset: spec.offset,
            host: held.map.host().is_some(),
        })
    }

    /// Lets go of `names` (the exporter may reuse their blocks once nobody else holds them);
    /// how many leases the exporter let go. They resolve no more from here.
    ///
    /// # Errors
    /// [`ShareError::Gone`] or [`ShareError::Timeout`] when the exporter does not answer
    /// (the names are forgotten here anyway).
    pub fn release(&mut self, names: &[&str]) -> Result<u32, ShareError> {
        for name in names {
            self.resolved.remove(*name);
        }
        let mut count = 0;
        for batch in names.chunks(limits::BATCH) {
            let names = batch.iter().map(|n| n.to_string()).collect();
            match self.request(Message::Release { names }, &[])?.0 {
                Message::Released { count: n } => count += n,
                other => return Err(unexpected("a release's answer", &other)),
            }
        }
        Ok(count)
    }

    /// Every name the exporter exports now.
    ///
    /// # Errors
    /// [`ShareError::Gone`], [`ShareError::Timeout`], [`ShareError::Protocol`].
    pub fn names(&mut self) -> Result<Vec<String>, ShareError> {
        let mut all: Vec<String> = Vec::new();
        loop {
            let after = all.last().cloned().unwrap_or_default();
            match self
                .request(
                    Message::List {
                        after: after.clone(),
                    },
                    &[],
                )?
                .0
            {
                Message::Names { names, more } => {
                    // Names come in order, after the last one: anything else would loop.
                    if names
                        .first()
                        .is_some_and(|n| !after.is_empty() && *n <= after)
                        || names.windows(2).any(|w| w[0] >= w[1])
                        || (more && names.is_empty())
                    {
                        return Err(ShareError::Protocol("names out of order".into()));
                    }
                    all.extend(names);
                    if all.len() > MAX_LISTED {
                        return Err(ShareError::Protocol(format!(
                            "more than {MAX_LISTED} names listed"
                        )));
                    }
                    if !more {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected("a page of names", &other)),
            }
        }
    }

    /// The names this process resolved and holds.
    pub fn held(&self) -> Vec<String> {
        self.resolved.keys().cloned().collect()
    }

    /// The host maps of `r`'s segments and the part of it in each: (map, offset in it,
    /// bytes).
    fn host_pieces(&self, r: &Resolved) -> Result<Vec<(&HostMap, u64, usize)>, ShareError> {
        let spec = self
            .resolved
            .get(&r.name)
            .ok_or_else(|| ShareError::UnknownName(r.name.clone()))?;
        self.pieces(spec)?
            .into_iter()
            .map(|(held, offset, len)| {
                let map = held.map.host().ok_or_else(|| {
                    ShareError::invalid("buffer", "device memory: read it on the device")
                })?;
                let len =
                    usize::try_from(len).map_err(|_| ShareError::invalid("size", "too big"))?;
                Ok((map, offset, len))
            })
            .collect()
    }

    /// A copy of the bytes of `r` (host memory only).
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for device memory.
    pub fn read(&self, r: &Resolved) -> Result<Vec<u8>, ShareError> {
        let mut out = Vec::new();
        for (map, offset, len) in self.host_pieces(r)? {
            out.extend(map.read(offset, len)?);
        }
        Ok(out)
    }

    /// Writes `bytes` at `offset` into `r` (host memory, writable buffers only).
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for device memory, a read-only buffer, or a range outside it.
    pub fn write(&self, r: &Resolved, offset: u64, bytes: &[u8]) -> Result<(), ShareError> {
        if r.readonly {
            return Err(ShareError::invalid("buffer", "exported read-only"));
        }
        let end = offset.checked_add(bytes.len() as u64);
        if !matches!(end, Some(end) if end <= r.size) {
            return Err(ShareError::invalid("range", "past the buffer's end"));
        }
        // The bytes of each piece that fall in `offset .. offset + len`.
        let (mut pos, mut rest) = (0u64, bytes);
        for (map, at, len) in self.host_pieces(r)? {
            let (lo, hi) = (pos, pos + len as u64);
            pos = hi;
            if hi <= offset || rest.is_empty() {
                continue;
            }
            let skip = offset.saturating_sub(lo);
            let n = ((hi - lo - skip) as usize).min(rest.len());
            map.write(at + skip, &rest[..n])?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Hands every segment this process maps and every name it holds to the exporter at
    /// `path` (one started with [`super::ExportOptions::accept_adoption`], after the exporter
    /// this process attached to died), copying nothing; from then on this attachment talks to
    /// that exporter and holds a lease there on each name it handed back. A segment that
    /// exporter did not take stays mapped here until the attachment is dropped, and its names
    /// are held no more. How many segments and names the new exporter took.
    ///
    /// # Errors
    /// As [`Attachment::attach`]; [`ShareError::Refused`] when that exporter adopts nothing.
    pub fn hand_back(&mut self, path: &Path) -> Result<(usize, u32), ShareError> {
        self.channel = Channel::connect(path, Instant::now() + self.timeout)?;
        self.path = path.to_path_buf();
        self.seq = 0;
        self.gone = false;
        let range = self.range_size;
        self.greet()?;
        // The new exporter keeps the places of the placed segments it takes, in a range as
        // large as the old one: they stay where this process maps them, and so do the ones it
        // places later. One with a range of its own (another size) places its segments in a
        // range of their own here: the old one stays with the segments mapped there.
        let same_places = self.range_size == 0 || self.range_size == range;
        if same_places {
            self.range_size = range;
        } else {
            self.placed = None;
        }
        let ids: Vec<SegmentId> = self.segments.keys().copied().collect();
        let mut renumbered: HashMap<SegmentId, SegmentId> = HashMap::new();
        for chunk in ids.chunks(limits::SEGMENTS) {
            let mut infos = Vec::with_capacity(chunk.len());
            let mut owned = Vec::with_capacity(chunk.len());
            for id in chunk {
                let held = &self.segments[id];
                infos.push(held.info.clone());
                owned.push(
                    held.map
                        .descriptor()?
                        .try_clone_to_owned()
                        .map_err(|e| ShareError::io("dup", e))?,
                );
            }
            let fds: Vec<BorrowedFd<'_>> = owned.iter().map(AsFd::as_fd).collect();
            let message = Message::Adopt {
                range,
                segments: infos,
                buffers: Vec::new(),
            };
            match self.request(message, &fds)?.0 {
                Message::Adopted { segments, .. } => {
                    for (old, new) in segments {
                        if !chunk.contains(&old) {
                            return Err(ShareError::Protocol(format!(
                                "adopted segment {old}, which was not sent"
                            )));
                        }
                        renumbered.insert(old, new);
                    }
                }
                other => return Err(unexpected("an adoption's answer", &other)),
            }
        }
        // Names in segments not taken are held no more; their segments stay mapped here.
        let buffers: Vec<(String, BufferSpec)> = std::mem::take(&mut self.resolved)
            .into_iter()
            .filter(|(_, spec)| renumbered.contains_key(&spec.segment))
            .collect();
        let mut names = 0;
        for chunk in buffers.chunks(limits::BATCH) {
            let message = Message::Adopt {
                range,
                segments: Vec::new(),
                buffers: chunk.to_vec(),
            };
            match self.request(message, &[])?.0 {
                Message::Adopted { names: n, .. } => names += n,
                other => return Err(unexpected("an adoption's answer", &other)),
            }
        }
        // A placed segment keeps its place here under its new number; one not taken keeps
        // its place out of use (it stays mapped there) while the range holds new ones.
        self.occupied.clear();
        for (old, mut held) in std::mem::take(&mut self.segments) {
            match (renumbered.get(&old), held.info.at) {
                (Some(&new), at) => {
                    held.info.id = new;
                    if let (Some(at), true) = (at, same_places) {
                        self.occupied.insert(at, new);
                    }
                    self.segments.insert(new, held);
                }
                (None, Some(at)) if same_places => {
                    self.orphan_places.insert(at, held.info.size);
                    self.orphans.push(held);
                }
                (None, _) => self.orphans.push(held),
            }
        }
        for (name, mut spec) in buffers {
            if let Some(&new) = renumbered.get(&spec.segment) {
                spec.segment = new;
                self.resolved.insert(name, spec);
            }
        }
        Ok((renumbered.len(), names))
    }
}

fn unexpected(wanted: &str, got: &Message) -> ShareError {
    ShareError::Protocol(format!("wanted {wanted}, got {got:?}"))
}
