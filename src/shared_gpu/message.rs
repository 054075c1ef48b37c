//! The messages processes sharing a GPU send each other: small JSON datagrams on the sockets in
//! the ledger's directory (only its user can reach them). A message out of shape is dropped.

use serde::{Deserialize, Serialize};

/// The largest message (bytes); a longer datagram is dropped.
pub const MAX_MESSAGE: usize = 2048;

/// One message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// Give back what your pools keep free: `from` is short of `bytes`.
    Give {
        /// The request's number (the answer carries it).
        id: u64,
        /// The asking process.
        from: u32,
        /// What it is short of.
        bytes: u64,
    },
    /// Sleep if you are idle and above your share: `from` is short of `bytes`.
    Sleep {
        /// The request's number.
        id: u64,
        /// The asking process.
        from: u32,
        /// What it is short of.
        bytes: u64,
    },
    /// The answer to request `id`.
    Answer {
        /// The request's number.
        id: u64,
        /// The answering process.
        from: u32,
        /// Bytes of device memory given back (trimmed or slept).
        given: u64,
        /// Why nothing, or less, was given (may be empty).
        note: String,
    },
}

impl Message {
    /// The datagram's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The message in `bytes`, or `None` when they are not one.
    pub fn decode(bytes: &[u8]) -> Option<Message> {
        if bytes.len() > MAX_MESSAGE {
            return None;
        }
        let message: Message = serde_json::from_slice(bytes).ok()?;
        match &message {
            Message::Answer { note, .. } if note.len() > 512 => None,
            _ => Some(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::Give {
                id: 1,
                from: 2,
                bytes: 3,
            },
            Message::Sleep {
                id: 4,
                from: 5,
                bytes: 6,
            },
            Message::Answer {
                id: 7,
                from: 8,
                given: 9,
                note: "idle".into(),
            },
        ] {
            assert_eq!(Message::decode(&m.encode()), Some(m));
        }
        assert_eq!(
            Message::decode(br#"{"op":"give","id":1,"from":2,"bytes":3,"x":1}"#),
            None
        );
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_dropped(bytes in prop::collection::vec(any::<u8>(), 0..3000)) {
            let _ = Message::decode(&bytes);
        }
    }
}
