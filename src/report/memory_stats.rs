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

impl Stat {
    /// Two pools' figures together (a peak is the sum of the peaks: at least the pair's).
    #[must_use]
    pub fn plus(self, o: Stat) -> Stat {
        Stat {
            current: self.current + o.current,
            peak: self.peak + o.peak,
            allocated: self.allocated + o.allocated,
            freed: self.freed + o.freed,
        }
    }
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
    /// Two pools' figures together, figure by figure ([`Stat::plus`]).
    #[must_use]
    pub fn plus(self, o: MemoryStats) -> MemoryStats {
        MemoryStats {
            allocation: self.allocation.plus(o.allocation),
            allocated_bytes: self.allocated_bytes.plus(o.allocated_bytes),
            segment: self.segment.plus(o.segment),
            reserved_bytes: self.reserved_bytes.plus(o.reserved_bytes),
            inactive_split: self.inactive_split + o.inactive_split,
            inactive_split_bytes: self.inactive_split_bytes + o.inactive_split_bytes,
            num_alloc_retries: self.num_alloc_retries + o.num_alloc_retries,
            num_ooms: self.num_ooms + o.num_ooms,
            num_device_alloc: self.num_device_alloc + o.num_device_alloc,
            num_device_free: self.num_device_free + o.num_device_free,
            num_sync_all_streams: self.num_sync_all_streams + o.num_sync_all_streams,
            offloaded_bytes: self.offloaded_bytes + o.offloaded_bytes,
        }
    }

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
