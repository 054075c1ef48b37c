//! A pool's figures in PyTorch's terms (`torch.cuda.memory_stats()`): the data; the counting is
//! the suballocators' (`suballocator/pool_stats.rs`).

/// One PyTorch figure: its value now, its peak, and what was added and removed in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value since creation or the last peak reset.
    pub peak: u64,
    /// Everything ever added.
    pub allocated: u64,
    /// Everything ever removed.
    pub freed: u64,
}

/// A pool's figures in PyTorch's terms (`torch.cuda.memory_stats()` keys, pool "all").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live allocations (`allocation.all.*`; `active.all.*` is the same here).
    pub allocation: Stat,
    /// Bytes of live blocks, 256-byte rounded (`allocated_bytes.all.*`, `active_bytes.all.*`).
    pub allocated_bytes: Stat,
    /// Chunks held from the upstream (`segment.all.*`); for the expandable pool, `current` and
    /// `peak` count runs of mapped pages and the totals stay 0.
    pub segment: Stat,
    /// Bytes held from the upstream or mapped (`reserved_bytes.all.*`).
    pub reserved_bytes: Stat,
    /// Free blocks inside segments that are in use (`inactive_split.all.current`).
    pub inactive_split: u64,
    /// Bytes of those blocks (`inactive_split_bytes.all.current`).
    pub inactive_split_bytes: u64,
    /// Allocations that had to free cached memory and try again (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory (`num_ooms`).
    pub num_ooms: u64,
    /// Successful upstream allocations, or growth steps that mapped pages (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Upstream frees, or trims that unmapped pages (`num_device_free`).
    pub num_device_free: u64,
    /// Times every stream was synchronized (`num_sync_all_streams`).
    pub num_sync_all_streams: u64,
    /// Bytes held but offloaded while the pool, or a pool below it, sleeps (rrmm's
    /// `offloaded_bytes.all.current`); `reserved_bytes.all.current` is 0 meanwhile: no page is
    /// mapped.
    pub offloaded_bytes: u64,
}

impl MemoryStats {
    /// The figures under PyTorch's key names, in PyTorch's order of families.
    pub fn to_pairs(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(48);
        let families: [(&str, &Stat); 6] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.allocation),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.allocated_bytes),
        ];
        for (family, stat) in families {
            for (metric, value) in [
                ("current", stat.current),
                ("peak", stat.peak),
                ("allocated", stat.allocated),
                ("freed", stat.freed),
            ] {
                out.push((format!("{family}.all.{metric}"), value));
            }
        }
        out.push(("inactive_split.all.current".into(), self.inactive_split));
        out.push((
            "inactive_split_bytes.all.current".into(),
            self.inactive_split_bytes,
        ));
        out.push(("offloaded_bytes.all.current".into(), self.offloaded_bytes));
        for (key, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_sync_all_streams", self.num_sync_all_streams),
        ] {
            out.push((key.into(), value));
        }
        out
    }
}
