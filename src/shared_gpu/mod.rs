//! One GPU, many processes: pools that give memory back, so nobody runs out while what is live
//! fits.
//!
//! Processes that opt in share a ledger per GPU: a directory (in `/dev/shm` by default, only
//! their user can write it) where each keeps an entry of what it holds (live and cached bytes),
//! its soft share and hard limit, whether it is idle, and what it asked and gave. No daemon
//! runs: a process that dies leaves an entry whose process is gone, which every member of its
//! pid namespace drops at once (so its share returns at the next read); an entry of another
//! namespace counts while it is written, then is stale ([`ledger_dir`], [`process`]).
//!
//! When an allocation on the GPU runs out, the process's own caches give back first
//! ([`crate::pressure`]); then, where it joined a ledger, the others are asked
//! ([`Member::ask_for`], by [`rules`], each wait with a deadline): those holding free memory in
//! their pools trim them (on their worker thread, without waiting for a pool that is busy:
//! their work never stops),
//! those above their share first; then idle processes above their share put their expandable
//! pools to sleep (live data to pinned host memory, addresses kept), which wake by themselves
//! at their next use or when the process is busy again ([`Member::set_idle`]). Only then is the
//! allocation refused. A hard limit (the user's, or the MPS pinned memory limit the driver
//! enforces, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) is never passed.
//!
//! Requests and answers are datagrams on each process's socket in the ledger's directory
//! ([`message`], [`socket`]: sends never wait); every entry and message is checked before use
//! ([`entry`], [`ledger_dir`]), and an answer counts only from the process asked and at most
//! what its entry shows it gave ([`trust`]).
//!
//! Without a GPU, processes share a simulated device by a name ([`simulated_device`]): they
//! compete for its bytes and join one ledger, so all of the above can be watched on any
//! machine.

mod answering;
mod asking;
pub mod entry;
mod idle;
pub mod ledger_dir;
mod listener;
mod member;
mod membership;
pub mod message;
pub mod options;
mod pending;
pub mod process;
mod publishing;
pub mod rules;
pub mod simulated_device;
pub mod socket;
pub mod trust;

pub use asking::AskReport;
pub use member::Member;
pub use options::{mps_limit, parse_size, ShareOptions, Size};

use crate::error::{Error, Result};
use crate::pressure::Place;
use crate::resource::{MemoryKind, SharedResource};
use parking_lot::Mutex;
use std::sync::Arc;

// Why process-wide: a process joins a GPU's ledger once, whoever asks (Python's reinitialize,
// a Dask plugin, a Rust program).
static MEMBERS: Mutex<Vec<Arc<Member>>> = Mutex::new(Vec::new());

/// Joins the ledger of the memory under `resource` (its link's place: the GPU, or a simulated
/// device) with `options`; the pools under `resource` sleep when the ledger asks. A process
/// that joined that ledger before leaves it first (new options replace the old).
///
/// # Errors
/// [`Error::InvalidArgument`] for host memory or memory that does not report its size; as
/// [`ledger_dir::LedgerDir::open`].
pub fn join(resource: &SharedResource, options: &ShareOptions) -> Result<Arc<Member>> {
    let link = resource.link();
    let (total, key) = match (link.place, link.kind) {
        (Place::Device(ordinal), _) => {
            let (_, total) = crate::cuda::device_memory_info(ordinal)?;
            let key = match &options.device_key {
                Some(key) => key.clone(),
                None => crate::cuda::device_uuid(ordinal)?,
            };
            (total, key)
        }
        (Place::Simulated(_), kind) => {
            if kind != MemoryKind::Simulated && options.device_key.is_none() {
                return Err(Error::invalid(
                    "mr",
                    format!(
                        "{} is {kind:?} memory, not a GPU's: only device memory or a simulated \
                         device is shared through a ledger (other memory only with an explicit \
                         device_key, for tests)",
                        resource.name()
                    ),
                ));
            }
            let Some((_, total)) = resource.memory_info() else {
                return Err(Error::invalid(
                    "mr",
                    format!(
                        "{} does not report its size: it cannot be shared",
                        resource.name()
                    ),
                ));
            };
            // A device shared by name has its ledger (every process over it joins it); a
            // device of this process alone, a ledger per size (tests).
            let key = options
                .device_key
                .clone()
                .or_else(|| link.device_key.as_deref().map(str::to_string))
                .unwrap_or_else(|| format!("simulated-{total}"));
            (total, key)
        }
    };
    // Every option checked before the old membership goes: a refused join changes nothing.
    options.check(link.device, Some(total as u64))?;
    leave(link.place);
    let member = Member::join(
        link.place,
        link.device,
        total as u64,
        &key,
        Some(resource.clone()),
        options,
    )?;
    MEMBERS.lock().push(member.clone());
    Ok(member)
}

/// This process's membership of the ledger of `place`, if it joined one.
pub fn member(place: Place) -> Option<Arc<Member>> {
    MEMBERS.lock().iter().find(|m| m.place() == place).cloned()
}

/// Every ledger this process joined.
pub fn members() -> Vec<Arc<Member>> {
    MEMBERS.lock().clone()
}

/// Leaves the ledger of `place`; whether the process was in it.
pub fn leave(place: Place) -> bool {
    let gone: Vec<Arc<Member>> = {
        let mut members = MEMBERS.lock();
        let (gone, kept) = members.drain(..).partition(|m| m.place() == place);
        *members = kept;
        gone
    };
    for m in &gone {
        m.leave();
    }
    !gone.is_empty()
}

/// Whether `RRMM_SHARE_GPU` asks every process to join its GPU's ledger (`1`, `true`, `yes`).
pub fn wanted_by_env() -> bool {
    std::env::var("RRMM_SHARE_GPU")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// A device's resource was set to `mr`, or made as its default (the first allocation of a
/// process that set nothing, through a framework's hook): where the process is in the ledger
/// of its memory, `mr`'s pools become the ones that sleep; where it is not and
/// `RRMM_SHARE_GPU` asks, it joins with the environment's options
/// ([`ShareOptions::from_env`]), over a GPU or a simulated device alike (a shared one's ledger
/// is its name's), however the resource came to be.
///
/// # Errors
/// As [`join`] and [`ShareOptions::from_env`].
pub fn resource_set(mr: &SharedResource) -> Result<()> {
    let link = mr.link();
    if let Some(m) = member(link.place) {
        m.set_resource(Some(mr.clone()));
        return Ok(());
    }
    let shareable = matches!(link.place, Place::Device(_)) || link.kind == MemoryKind::Simulated;
    if !wanted_by_env() || !shareable {
        return Ok(());
    }
    join(mr, &ShareOptions::from_env()?).map(|_| ())
}
