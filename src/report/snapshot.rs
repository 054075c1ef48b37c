//! A pool's segments and blocks, in the shape of PyTorch's `torch.cuda.memory._snapshot()`
//! (the Python edge writes the dicts; this is the data).

#![deny(unsafe_code)]

/// Whether a block is handed out or free (PyTorch's `active_allocated` and `inactive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out and not freed.
    Allocated,
    /// Free in one of the pool's lists.
    Free,
}

impl BlockState {
    /// PyTorch's name of the state.
    pub fn torch_name(self) -> &'static str {
        match self {
            BlockState::Allocated => "active_allocated",
            BlockState::Free => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// First address.
    pub address: usize,
    /// Bytes of the block.
    pub size: usize,
    /// Bytes asked for (the block's size where the pool does not keep the request; 0 when free).
    pub requested_size: usize,
    /// Handed out or free.
    pub state: BlockState,
}

/// One segment: an upstream chunk of a pool, or a run of mapped pages of an expandable pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First address.
    pub address: usize,
    /// Bytes of the segment.
    pub total_size: usize,
    /// Whether the segment is part of an expandable (virtual memory) range.
    pub expandable: bool,
    /// The tier that holds it (`"device"`, `"peer"`, `"host"`), where the resource has tiers
    /// ([`TieredMemoryResource`](crate::adaptor::TieredMemoryResource)); `None` otherwise.
    pub tier: Option<String>,
    /// Whether the pool sleeps ([`ExpandableMemoryResource::offload`](crate::ExpandableMemoryResource::offload)):
    /// the segment's pages were given back to the driver and its live bytes are on the host
    /// until `restore()`; its addresses stay reserved.
    pub offloaded: bool,
    /// Its blocks in address order, covering the segment exactly.
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    /// A segment of one allocated block (an allocation a resource took whole from a source).
    pub fn one_block(address: usize, size: usize) -> SegmentInfo {
        SegmentInfo {
            address,
            total_size: size,
            expandable: false,
            tier: None,
            offloaded: false,
            blocks: vec![BlockInfo {
                address,
                size,
                requested_size: size,
                state: BlockState::Allocated,
            }],
        }
    }

    /// Bytes of allocated blocks.
    pub fn allocated_size(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::Allocated)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes requested by the allocated blocks.
    pub fn requested_size(&self) -> usize {
        self.blocks.iter().map(|b| b.requested_size).sum()
    }
}

/// Builds the segments from `segments` (address, size), the allocated blocks (address, size,
/// requested) and the free blocks (address, size). Blocks are sorted into their segments; a part
/// of a segment no block covers (which a consistent pool never has) shows as a free block, so
/// every segment is covered exactly, as PyTorch's tools assume.
///
/// # Time Complexity
/// O((segments + blocks) log(blocks)).
pub fn assemble(
    segments: &[(usize, usize)],
    allocated: &[(usize, usize, usize)],
    free: &[(usize, usize)],
    expandable: bool,
) -> Vec<SegmentInfo> {
    let mut blocks: Vec<BlockInfo> = allocated
        .iter()
        .map(|&(address, size, requested_size)| BlockInfo {
            address,
            size,
            requested_size,
            state: BlockState::Allocated,
        })
        .chain(free.iter().map(|&(address, size)| BlockInfo {
            address,
            size,
            requested_size: 0,
            state: BlockState::Free,
        }))
        .collect();
    blocks.sort_by_key(|b| b.address);
    let mut segments = segments.to_vec();
    segments.sort_unstable();
    segments
        .into_iter()
        .map(|(address, total_size)| {
            let end = address + total_size;
            let first = blocks.partition_point(|b| b.address < address);
            let mut out = Vec::new();
            let mut at = address;
            for b in blocks[first..].iter().take_while(|b| b.address < end) {
                if b.address > at {
                    out.push(gap(at, b.address - at));
                }
                out.push(*b);
                at = b.address + b.size;
            }
            if at < end {
                out.push(gap(at, end - at));
            }
            SegmentInfo {
                address,
                total_size,
                expandable,
                tier: None,
                offloaded: false,
                blocks: out,
            }
        })
        .collect()
}

fn gap(address: usize, size: usize) -> BlockInfo {
    BlockInfo {
        address,
        size,
        requested_size: 0,
        state: BlockState::Free,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_land_in_their_segments_in_order_and_cover_them() {
        let segs = assemble(
            &[(0x10000, 0x1000), (0x1000, 0x800)],
            &[(0x1000, 0x100, 0xf0), (0x10400, 0x200, 0x200)],
            &[(0x1100, 0x700), (0x10000, 0x400)],
            false,
        );
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].address, 0x1000);
        assert_eq!(segs[0].blocks.len(), 2);
        assert_eq!(segs[0].allocated_size(), 0x100);
        assert_eq!(segs[0].requested_size(), 0xf0);
        let tail = segs[1].blocks.last().unwrap();
        assert_eq!(
            (tail.address, tail.size, tail.state),
            (0x10600, 0xa00, BlockState::Free),
            "an uncovered tail shows as free"
        );
        for s in &segs {
            assert_eq!(s.blocks.iter().map(|b| b.size).sum::<usize>(), s.total_size);
        }
        assert_eq!(BlockState::Allocated.torch_name(), "active_allocated");
    }
}
