//! Tests of the protocol end to end: an exporter and importers over real sockets
//! ([`exchange`]), hostile peers ([`hostile`]), lifetimes against a model ([`lifetimes`]), and
//! real processes ([`processes`]).

mod exchange;
mod hostile;
mod lifetimes;
mod processes;

use super::message::BufferSpec;
use super::SegmentId;
use crate::shared_gpu::ledger_dir::LedgerDir;
use std::path::PathBuf;

/// A ledger directory of its own, removed when dropped.
pub(super) struct TempLedger {
    pub dir: LedgerDir,
    base: PathBuf,
}

impl TempLedger {
    pub fn new(tag: &str) -> TempLedger {
        let base = std::env::temp_dir().join(format!("rrmm-share-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = LedgerDir::open(&base, "memfd").unwrap();
        TempLedger { dir, base }
    }

    /// The socket of exporter `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.share_path(name).unwrap()
    }
}

impl Drop for TempLedger {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// `len` bytes that depend on `seed` and on each byte's place (splitmix64).
pub(super) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while out.len() < len {
        let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// A buffer of `size` bytes at `offset` of segment `segment`, as `uint8`.
pub(super) fn bytes_at(segment: SegmentId, offset: u64, size: u64, readonly: bool) -> BufferSpec {
    BufferSpec {
        segment,
        offset,
        size,
        dtype: "|u1".into(),
        shape: vec![size],
        readonly,
    }
}
