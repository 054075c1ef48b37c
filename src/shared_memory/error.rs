//! The errors of sharing memory: what a message's decoder refuses ([`WireError`]) and what a
//! call of the exporter or an importer fails with ([`ShareError`]).

use std::io;

/// Why bytes are not a message. Every decode of a peer's bytes ends in a message or one of these,
/// never a panic, and never allocates more than the bytes it was given allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the field being read needs.
    #[error("truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        /// The field.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// The frame does not start with this protocol's magic bytes.
    #[error("not a shared-memory message (bad magic)")]
    Magic,
    /// The frame is of another protocol version.
    #[error("protocol version {0}, this process speaks {version}", version = super::message::VERSION)]
    Version(u16),
    /// An unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// An unknown value of a tagged field.
    #[error("unknown {what} {value}")]
    Tag {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u8,
    },
    /// The header's length does not match the frame's.
    #[error("the header declares {declared} bytes of body, the frame has {actual}")]
    Length {
        /// What the header says.
        declared: usize,
        /// What came.
        actual: usize,
    },
    /// A count or length past its limit.
    #[error("{what}: {got} is more than the limit {max}")]
    Limit {
        /// The field.
        what: &'static str,
        /// The limit.
        max: usize,
        /// What came.
        got: usize,
    },
    /// A text field that is not valid (not UTF-8, empty, or with control characters).
    #[error("{0} is not valid text")]
    Text(&'static str),
    /// Bytes left after the message.
    #[error("{0} bytes after the message")]
    Trailing(usize),
    /// The reserved header byte is not zero.
    #[error("reserved header flags {0:#x} set")]
    Flags(u8),
}

/// Why a peer refused a request, as the wire carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The request could not be decoded.
    Malformed,
    /// The request's sequence number is not the next one (a replayed, dropped or reordered
    /// message).
    OutOfOrder,
    /// The request is not one this side answers now (a reply sent as a request, a second
    /// greeting, a request before the greeting).
    Unexpected,
    /// The request asks for something the exporter does not do (adoption when not enabled).
    NotAllowed,
    /// The exporter serves as many importers as it may.
    Busy,
}

impl Refusal {
    /// Its code on the wire.
    pub fn code(self) -> u8 {
        match self {
            Refusal::Malformed => 1,
            Refusal::OutOfOrder => 2,
            Refusal::Unexpected => 3,
            Refusal::NotAllowed => 4,
            Refusal::Busy => 5,
        }
    }

    /// The refusal of a code on the wire.
    ///
    /// # Errors
    /// [`WireError::Tag`] for an unknown code.
    pub fn from_code(code: u8) -> Result<Refusal, WireError> {
        Ok(match code {
            1 => Refusal::Malformed,
            2 => Refusal::OutOfOrder,
            3 => Refusal::Unexpected,
            4 => Refusal::NotAllowed,
            5 => Refusal::Busy,
            value => {
                return Err(WireError::Tag {
                    what: "refusal",
                    value,
                })
            }
        })
    }
}

/// Every way sharing memory fails.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The peer's bytes were not a message.
    #[error("a peer sent a bad message: {0}")]
    Wire(#[from] WireError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// A wait on the peer passed its deadline.
    #[error("{0}: the peer did not answer in time")]
    Timeout(&'static str),
    /// The peer closed its end (it exited, was killed, or let go).
    #[error("the peer is gone (its socket closed)")]
    Gone,
    /// The peer is another user's process.
    #[error("the peer runs as user {peer}, not as this process's user {me}")]
    PeerUser {
        /// The peer's user.
        peer: u32,
        /// This process's user.
        me: u32,
    },
    /// The peer refused the request.
    #[error("the exporter refused the request ({reason:?}): {detail}")]
    Refused {
        /// Why.
        reason: Refusal,
        /// Its words.
        detail: String,
    },
    /// No buffer of that name is exported.
    #[error("no buffer named {0:?} is exported")]
    UnknownName(String),
    /// A buffer of that name is exported already.
    #[error("a buffer named {0:?} is exported already")]
    NameTaken(String),
    /// An argument out of its domain.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The argument.
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// A peer broke the protocol with a well-formed message (an answer to another request, a
    /// buffer outside its segment, a segment sent twice, descriptors that do not match).
    #[error("the peer broke the protocol: {0}")]
    Protocol(String),
    /// The driver failed (a driver-handle segment).
    #[error(transparent)]
    Driver(#[from] crate::Error),
}

impl ShareError {
    /// An I/O error of `what`.
    pub fn io(what: &'static str, source: impl Into<io::Error>) -> ShareError {
        ShareError::Io {
            what,
            source: source.into(),
        }
    }

    /// An invalid argument.
    pub fn invalid(what: &'static str, why: impl Into<String>) -> ShareError {
        ShareError::Invalid {
            what,
            why: why.into(),
        }
    }
}

impl From<ShareError> for crate::Error {
    fn from(e: ShareError) -> crate::Error {
        match e {
            ShareError::Driver(e) => e,
            ShareError::Invalid { what, why } => crate::Error::invalid(what, why),
            ShareError::NameTaken(_) => crate::Error::invalid("name", e.to_string()),
            ShareError::UnknownName(_) => crate::Error::OutOfRange(e.to_string()),
            other => crate::Error::Logic(format!("shared memory: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_codes_round_trip_and_unknown_codes_are_refused() {
        for r in [
            Refusal::Malformed,
            Refusal::OutOfOrder,
            Refusal::Unexpected,
            Refusal::NotAllowed,
            Refusal::Busy,
        ] {
            assert_eq!(Refusal::from_code(r.code()), Ok(r));
        }
        assert!(Refusal::from_code(0).is_err());
        assert!(Refusal::from_code(200).is_err());
    }

    #[test]
    fn share_errors_become_the_crates_errors() {
        let e: crate::Error = ShareError::invalid("name", "empty").into();
        assert!(matches!(
            e,
            crate::Error::InvalidArgument {
                argument: "name",
                ..
            }
        ));
        let e: crate::Error = ShareError::UnknownName("x".into()).into();
        assert!(matches!(e, crate::Error::OutOfRange(_)));
        let e: crate::Error = ShareError::Gone.into();
        assert!(e.to_string().contains("gone"), "{e}");
    }
}
