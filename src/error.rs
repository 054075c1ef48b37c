//! The one error type of rrmm.

/// Every way an rrmm call can fail. Out-of-memory is its own variant so that callers (and Python,
/// where it becomes `MemoryError`) can react to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A resource could not satisfy a request.
    #[error("{message}")]
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// Full message, RMM-style (`std::bad_alloc: out_of_memory: ...`).
        message: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error at {call}: {name} ({code}): {description}")]
    Cuda {
        /// The driver function that failed.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The error's name, for example `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// The driver's description of the error.
        description: String,
    },
    /// No CUDA driver could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// An argument was out of its domain.
    #[error("invalid argument `{argument}`: {message}")]
    InvalidArgument {
        /// The argument's name.
        argument: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A logic error: a call made in a state that does not allow it (RMM's `logic_error`).
    #[error("{0}")]
    Logic(String),
    /// An index or level that does not exist (RMM's `out_of_range`).
    #[error("{0}")]
    OutOfRange(String),
    /// A file could not be read or written.
    #[error("I/O error on {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The system's message.
        message: String,
    },
}

impl Error {
    /// An out-of-memory error for `requested` bytes with a reason, in RMM's wording.
    pub fn out_of_memory(requested: usize, reason: impl std::fmt::Display) -> Self {
        Error::OutOfMemory {
            requested,
            message: format!(
                "std::bad_alloc: out_of_memory: {reason} (failed to allocate {requested} bytes)"
            ),
        }
    }

    /// An invalid-argument error.
    pub fn invalid(argument: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            message: message.into(),
        }
    }

    /// Whether this is an out-of-memory error.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }
}

/// Result with rrmm's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
