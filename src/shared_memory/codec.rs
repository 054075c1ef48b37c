//! The bytes under the messages: little-endian integers, length-prefixed text and counted lists.
//! A [`Reader`] reads only what its bytes hold: every length and count is checked against its
//! limit and against the bytes left before anything is allocated.

use super::error::WireError;

/// Writes fields into a growing buffer.
#[derive(Debug, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }

    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a count (a `u16`; callers keep their lists within the limits, which are far
    /// below `u16::MAX`).
    pub fn count(&mut self, n: usize) {
        self.u16(u16::try_from(n).unwrap_or(u16::MAX));
    }

    /// Appends text: a `u16` length and its bytes.
    pub fn text(&mut self, s: &str) {
        self.count(s.len());
        self.bytes.extend_from_slice(s.as_bytes());
    }
}

/// Reads fields from a peer's bytes, each checked.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.bytes.len()
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`WireError::Truncated`] when fewer are left.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.bytes.len() {
            return Err(WireError::Truncated {
                what,
                need: n,
                have: self.bytes.len(),
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// One byte.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A `u16`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A `u32`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A `u64`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A boolean byte (0 or 1).
    ///
    /// # Errors
    /// [`WireError::Truncated`]; [`WireError::Tag`] for another value.
    pub fn flag(&mut self, what: &'static str) -> Result<bool, WireError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(WireError::Tag { what, value }),
        }
    }

    /// A `u16` length or count of at most `max`.
    fn length(&mut self, max: usize, what: &'static str) -> Result<usize, WireError> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(WireError::Limit { what, max, got: n });
        }
        Ok(n)
    }

    /// A count of items of at least `min_item` bytes each, at most `max`: checked against the
    /// limit and against the bytes left, so a list is never allocated beyond what came.
    ///
    /// # Errors
    /// [`WireError::Limit`]; [`WireError::Truncated`] when the items cannot fit in what is left.
    pub fn count(
        &mut self,
        max: usize,
        min_item: usize,
        what: &'static str,
    ) -> Result<usize, WireError> {
        let n = self.length(max, what)?;
        let need = n.saturating_mul(min_item.max(1));
        if need > self.left() {
            return Err(WireError::Truncated {
                what,
                need,
                have: self.left(),
            });
        }
        Ok(n)
    }

    /// Text of at most `max` bytes: UTF-8 without control characters; empty only when
    /// `allow_empty`.
    ///
    /// # Errors
    /// [`WireError::Limit`], [`WireError::Truncated`], [`WireError::Text`].
    pub fn text(
        &mut self,
        max: usize,
        allow_empty: bool,
        what: &'static str,
    ) -> Result<String, WireError> {
        let n = self.length(max, what)?;
        let bytes = self.take(n, what)?;
        let s = std::str::from_utf8(bytes).map_err(|_| WireError::Text(what))?;
        check_text(s, max, allow_empty, what)?;
        Ok(s.to_string())
    }

    /// Checks that every byte was read.
    ///
    /// # Errors
    /// [`WireError::Trailing`].
    pub fn finish(self) -> Result<(), WireError> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// Whether `s` is text a message may carry: at most `max` bytes, no control characters, empty
/// only when `allow_empty`.
///
/// # Errors
/// [`WireError::Limit`] or [`WireError::Text`].
pub fn check_text(
    s: &str,
    max: usize,
    allow_empty: bool,
    what: &'static str,
) -> Result<(), WireError> {
    if s.len() > max {
        return Err(WireError::Limit {
            what,
            max,
            got: s.len(),
        });
    }
    if (!allow_empty && s.is_empty()) || s.chars().any(char::is_control) {
        return Err(WireError::Text(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let mut w = Writer::new();
        w.u8(1);
        w.u16(2);
        w.u32(3);
        w.u64(4);
        w.text("name");
        w.u8(1);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u8("a"), Ok(1));
        assert_eq!(r.u16("b"), Ok(2));
        assert_eq!(r.u32("c"), Ok(3));
        assert_eq!(r.u64("d"), Ok(4));
        assert_eq!(r.text(8, false, "e").as_deref(), Ok("name"));
        assert_eq!(r.flag("f"), Ok(true));
        r.finish().unwrap();
    }

    #[test]
    fn lengths_and_counts_are_checked_before_anything_is_allocated() {
        // A count of 60000 items of 8 bytes in a 4-byte body: refused, nothing allocated.
        let mut r = Reader::new(&[0x60, 0xea, 0, 0, 0, 0]);
        assert!(matches!(
            r.count(100, 8, "items"),
            Err(WireError::Limit { .. })
        ));
        let mut r = Reader::new(&[10, 0, 0, 0]);
        assert!(matches!(
            r.count(100, 8, "items"),
            Err(WireError::Truncated { .. })
        ));
        let mut r = Reader::new(&[5, 0, b'a']);
        assert!(matches!(
            r.text(8, false, "t"),
            Err(WireError::Truncated { .. })
        ));
        let mut r = Reader::new(&[2, 0, 0xff, 0xfe]);
        assert_eq!(r.text(8, false, "t"), Err(WireError::Text("t")));
        let mut r = Reader::new(&[1, 0, b'\n']);
        assert_eq!(r.text(8, false, "t"), Err(WireError::Text("t")));
        let mut r = Reader::new(&[0, 0]);
        assert_eq!(r.text(8, false, "t"), Err(WireError::Text("t")));
        let mut r = Reader::new(&[2]);
        assert!(matches!(r.flag("f"), Err(WireError::Tag { value: 2, .. })));
        assert_eq!(Reader::new(&[1]).finish(), Err(WireError::Trailing(1)));
    }
}
