//! The operating-system floor: the one place besides `cuda/` that makes system calls
//! (`unsafe`, each with its `// SAFETY:` line). Nothing here imports from above.
//!
//! - [`host_memory`]: whether a host address range is mapped and readable or writable in this
//!   process, asked of the kernel without touching the memory (so a bogus address a user
//!   passes is an error, never a fault).

pub mod host_memory;
