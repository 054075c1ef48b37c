//! Host pages: the one area of the host memory rrmm makes for the device's data, of two kinds.
//!
//! - [`registered`]: **registered pinned ranges** (and plain ranges for host virtual memory),
//!   the process's one supply ([`registered::HostPageSupply`]): host memory at host addresses,
//!   registered with the driver so copies run at the link's speed. A sleep's host copy, a pinned
//!   host pool's ranges and a host tier take them; they can never become device memory at the
//!   same address.
//! - [`mapped`]: **pages the driver maps under a pool's addresses** ([`mapped::HostPageKeep`]):
//!   host memory made by `cuMemCreate` on the device's host NUMA node and mapped into an
//!   expandable pool's own address range when the device is full (spill), so the device reads
//!   it in place and a promotion can put device memory under the same addresses later.
//!
//! Beside them, [`disk`]: a sleeping pool's bytes in files instead of host memory, streamed
//! through two small ranges of the supply.

pub mod disk;
pub mod mapped;
pub mod registered;
