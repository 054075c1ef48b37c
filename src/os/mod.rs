//! The operating-system floor: the one place besides `cuda/` that makes system calls
//! (`unsafe`, each with its `// SAFETY:` line). Nothing here imports from above.
//!
//! - [`host_memory`]: whether a host address range is mapped and readable or writable in this
//!   process, asked of the kernel without touching the memory (so a bogus address a user
//!   passes is an error, never a fault).
//! - [`cgroup`]: the room under every memory limit of the process's control groups (v1 and
//!   v2, its own group and each ancestor), read from a root path (fake trees in tests).
//! - [`host_pages`]: anonymous host ranges reserved, committed on a NUMA node with huge pages and
//!   faulted in from several threads, and given back (the fast start of pinned memory).
//! - [`file_lock`]: an exclusive `flock` on an open file, for several processes' read-modify-
//!   writes of one small file.

pub mod cgroup;
pub mod file_lock;
pub mod host_memory;
pub mod host_pages;
