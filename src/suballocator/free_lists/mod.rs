//! The free-list strategies over the core's [`FreeList`](super::core::FreeList) interface
//! (coalescing TLSF-style lists for the pool and the expandable pool, stacks of equal blocks
//! for fixed-size, whole blocks by size class for the managed pool) and the size-class math they
//! and the arena share.

mod coalescing_free_list;
mod fixed_size_free_list;
pub(super) mod size_classes;
mod whole_block_free_list;

pub(super) use coalescing_free_list::CoalescingFreeList;
pub(super) use fixed_size_free_list::FixedSizeFreeList;
pub(super) use whole_block_free_list::WholeBlockFreeList;
