//! The tiers of the memory below a resource, as its link carries them: a tiered resource
//! (device pool, then a peer GPU, then pinned host memory) puts its [`TierBook`] in its link,
//! and every resource built over it (adaptors, suballocators) carries it up, so the tiers'
//! counters are read from any resource of the stack (a replay's figures per tier), with no walk
//! over the graph.

use serde::Serialize;

/// The counters of one tier (requested bytes, as the statistics adaptor counts them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TierCounts {
    /// The tier's name.
    pub name: String,
    /// The resource's name (`"pool"`, `"peer"`, `"pinned_host"`, `"simulated"`).
    pub resource: String,
    /// Bytes of the tier's live allocations.
    pub current_bytes: usize,
    /// The most bytes live on the tier at once.
    pub peak_bytes: usize,
    /// Bytes of every allocation the tier ever served.
    pub total_bytes: u128,
    /// Live allocations on the tier.
    pub current_allocations: usize,
    /// The most allocations live on the tier at once.
    pub peak_allocations: usize,
    /// Allocations the tier ever served.
    pub total_allocations: u64,
    /// Allocations the tier refused for want of memory, which went on to the next tier (or
    /// failed, on the last).
    pub refused: u64,
}

/// The tiers of a tiered resource, read through the link of any resource over it.
pub trait TierBook: Send + Sync + std::fmt::Debug {
    /// The counters of every tier, in the order they are tried.
    fn tier_counts(&self) -> Vec<TierCounts>;
}
