//! The one error type of rrmm.

use std::any::Any;
use std::sync::Arc;

/// A value that travels inside [`Error::Callback`]: whatever a user callback failed with (for
/// the Python layer, the exact Python exception), shared and never inspected by rrmm. Two
/// payloads are equal when they are the same value (`Arc::ptr_eq`).
#[derive(Clone)]
pub struct CallbackPayload(pub Arc<dyn Any + Send + Sync>);

impl CallbackPayload {
    /// Wraps `value`.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        CallbackPayload(Arc::new(value))
    }

    /// The value, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl std::fmt::Debug for CallbackPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackPayload(..)")
    }
}

impl PartialEq for CallbackPayload {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CallbackPayload {}

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
    /// A user callback (a [`CallbackMemoryResource`](crate::resource::CallbackMemoryResource)
    /// function, a failure callback) failed; `payload` carries its own error value (for Python,
    /// the exception to re-raise unchanged). Adaptors and suballocators pass it through
    /// untouched.
    #[error("{message}")]
    Callback {
        /// A description for logs and Rust callers.
        message: String,
        /// Whether the callback reported out of memory (a Python `MemoryError`): such an error
        /// counts as out of memory ([`Error::is_out_of_memory`]), so pools and failure
        /// callbacks react to it as to any other.
        out_of_memory: bool,
        /// The callback's own error value.
        payload: CallbackPayload,
    },
    /// Device `device` cannot use memory of device `peer` directly: the machine has no such
    /// GPU, or the two GPUs have no peer link (NVLink or PCIe peer-to-peer). Python: a
    /// `RuntimeError`.
    #[error("no peer link: device {device} cannot use memory of peer device {peer}: {reason}")]
    NoPeerAccess {
        /// The device that would read the memory.
        device: usize,
        /// The GPU that would hold it.
        peer: usize,
        /// Why not, in words.
        reason: String,
    },
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

    /// The reason of an out-of-memory error made by [`Error::out_of_memory`], without RMM's
    /// words around it (`std::bad_alloc: out_of_memory: ` and `(failed to allocate N bytes)`),
    /// so that a wrapper can say it again for its own request without repeating them; the
    /// whole message of another out-of-memory error; `None` for other errors.
    pub fn out_of_memory_reason(&self) -> Option<&str> {
        let Error::OutOfMemory { requested, message } = self else {
            return None;
        };
        let text = message
            .strip_prefix("std::bad_alloc: out_of_memory: ")
            .unwrap_or(message);
        let suffix = format!(" (failed to allocate {requested} bytes)");
        Some(text.strip_suffix(suffix.as_str()).unwrap_or(text))
    }

    /// An invalid-argument error.
    pub fn invalid(argument: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            message: message.into(),
        }
    }

    /// A callback's failure carrying `payload` (see [`Error::Callback`]).
    pub fn callback(
        message: impl Into<String>,
        out_of_memory: bool,
        payload: impl Any + Send + Sync,
    ) -> Self {
        Error::Callback {
            message: message.into(),
            out_of_memory,
            payload: CallbackPayload::new(payload),
        }
    }

    /// The bytes an out-of-memory error asked for (`None` for other errors).
    pub fn requested_bytes(&self) -> Option<usize> {
        match self {
            Error::OutOfMemory { requested, .. } => Some(*requested),
            _ => None,
        }
    }

    /// Whether this is an out-of-memory error (including a callback's out of memory).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::OutOfMemory { .. }
                | Error::Callback {
                    out_of_memory: true,
                    ..
                }
        )
    }

    /// The payload of a callback's failure, if this is one and it holds a `T`.
    pub fn callback_payload<T: Any>(&self) -> Option<&T> {
        match self {
            Error::Callback { payload, .. } => payload.downcast_ref::<T>(),
            _ => None,
        }
    }
}

/// Result with rrmm's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_error_carries_its_payload_and_may_be_out_of_memory() {
        #[derive(Debug, PartialEq)]
        struct Raised(&'static str);
        let e = Error::callback("callback raised KeyError", false, Raised("KeyError"));
        assert_eq!(e.callback_payload::<Raised>(), Some(&Raised("KeyError")));
        assert_eq!(e.callback_payload::<String>(), None);
        assert!(!e.is_out_of_memory());
        assert_eq!(e.to_string(), "callback raised KeyError");
        assert_eq!(e.clone(), e, "a clone shares the payload");
        let other = Error::callback("callback raised KeyError", false, Raised("KeyError"));
        assert_ne!(other, e, "another payload is another error");
        assert!(Error::callback("MemoryError", true, ()).is_out_of_memory());
        assert_eq!(Error::Logic("x".into()).callback_payload::<()>(), None);
    }

    #[test]
    fn an_out_of_memory_reason_is_said_without_rmms_words_around_it() {
        let e = Error::out_of_memory(512, "the device is full");
        assert_eq!(e.out_of_memory_reason(), Some("the device is full"));
        let other = Error::OutOfMemory {
            requested: 8,
            message: "Exceeded memory limit".into(),
        };
        assert_eq!(other.out_of_memory_reason(), Some("Exceeded memory limit"));
        assert_eq!(Error::Logic("x".into()).out_of_memory_reason(), None);
    }
}
