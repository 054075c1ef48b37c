//! A suballocator over a sleeping pool: the expandable pools under its upstream, whose pages a
//! sleep unmaps, and the refusal of what the suballocator would hand out from its own cache.
//!
//! A suballocator (a pool, an arena, fixed-size blocks, binning) over an expandable pool holds
//! chunks that are live blocks of that pool. When the pool sleeps, those chunks' bytes are on
//! the host and their pages are gone; a block the suballocator carved from a cached free range
//! would point at unmapped memory, which a kernel cannot touch. So the suballocator reads the
//! pools' sleep flags before it hands out anything, and refuses as the pool itself does
//! (a logic error, not out of memory: fallbacks and failure callbacks do not take a sleep for
//! pressure). A block handed out before the sleep started is a live block like any other.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The sleep flags of the expandable pools under a suballocator's upstream (none for most
/// stacks: then the check is one length test).
#[derive(Debug, Default)]
pub(crate) struct UpstreamSleep(Box<[Arc<AtomicBool>]>);

impl UpstreamSleep {
    /// Watches `flags` (each set while its pool sleeps, falls asleep or wakes).
    pub(crate) fn new(flags: Vec<Arc<AtomicBool>>) -> Self {
        UpstreamSleep(flags.into_boxed_slice())
    }

    /// Whether a pool under the upstream sleeps.
    #[inline]
    pub(crate) fn asleep(&self) -> bool {
        self.0.iter().any(|f| f.load(Ordering::Acquire))
    }

    /// [`Error::Logic`] naming `name` while a pool under the upstream sleeps.
    #[inline]
    pub(crate) fn check(&self, name: &str, bytes: usize) -> Result<()> {
        if self.asleep() {
            return Err(Error::Logic(format!(
                "{name}: the expandable pool under it is asleep (offloaded to host memory); \
                 restore() it first (allocation of {bytes} bytes refused)"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_while_a_flag_is_set() {
        let a = Arc::new(AtomicBool::new(false));
        let b = Arc::new(AtomicBool::new(false));
        let watch = UpstreamSleep::new(vec![a.clone(), b.clone()]);
        assert!(watch.check("pool", 8).is_ok());
        b.store(true, Ordering::Release);
        let e = watch.check("pool", 8).unwrap_err();
        assert!(
            matches!(e, Error::Logic(_)) && e.to_string().contains("asleep"),
            "{e}"
        );
        b.store(false, Ordering::Release);
        assert!(watch.check("pool", 8).is_ok());
        assert!(UpstreamSleep::default().check("pool", 8).is_ok());
    }
}
