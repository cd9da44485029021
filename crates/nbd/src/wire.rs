//! A bounds-checked big-endian reader over a byte slice: every NBD parser (options,
//! request headers) reads through it, so a short or garbled frame yields `None`, never a
//! panic.

/// Reads big-endian integers and byte runs from the front of a slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// The next `n` bytes, or `None` if fewer remain.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let head = self.buf.get(..n)?;
        self.buf = self.buf.get(n..)?;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A big-endian u16.
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    /// A big-endian u32.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    /// A big-endian u64.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    /// A string of `len` bytes that must be UTF-8 and no longer than the protocol's limit.
    pub(crate) fn string(&mut self, len: usize) -> Option<String> {
        if len > crate::proto::MAX_STRING {
            return None;
        }
        let raw = self.take(len)?;
        std::str::from_utf8(raw).ok().map(str::to_owned)
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_reader_reads_big_endian_and_stops_at_end() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 9]);
        assert_eq!(r.u16(), Some(1));
        assert_eq!(r.u32(), Some(2));
        assert_eq!(r.remaining(), 1);
        assert_eq!(r.u16(), None);
        assert_eq!(r.take(1), Some(&[9u8][..]));
        assert_eq!(r.take(1), None);
    }

    #[test]
    fn test_reader_rejects_bad_utf8_and_long_strings() {
        assert_eq!(Reader::new(&[0xff, 0xfe]).string(2), None);
        assert_eq!(Reader::new(b"ab").string(2).as_deref(), Some("ab"));
        let long = vec![b'a'; crate::proto::MAX_STRING + 1];
        assert_eq!(Reader::new(&long).string(long.len()), None);
    }
}
