//! Block checksums of the object store: how a 4 KiB block's crc32c is stored in the
//! sidecar `.crc` file and checked on read.
//!
//! The stored value is `crc32c(block) ^ crc32c(4096 zero bytes)`. A block of zeros
//! therefore stores 0, which is what a hole in the `.crc` file (or a read past its
//! end) returns: a never-written or punched block verifies without any checksum
//! having been written for it, and zeroing a range only has to zero its entries.
use drove_types::{Error, ErrorKind, ObjectId, BLOCK_SIZE};

/// Bytes in a block, as a `usize` for slicing.
pub(crate) const BLOCK: usize = BLOCK_SIZE as usize;

/// Bytes of one stored checksum.
pub(crate) const CRC_LEN: usize = 4;

/// crc32c of 4096 zero bytes (checked by a test).
const ZERO_BLOCK_CRC: u32 = 0x98f9_4189;

/// The value stored for `block` (exactly [`BLOCK`] bytes).
pub(crate) fn stored_crc(block: &[u8]) -> u32 {
    crc32c::crc32c(block) ^ ZERO_BLOCK_CRC
}

/// The stored checksum at entry `i` of a buffer of little-endian entries.
pub(crate) fn entry(crcs: &[u8], i: usize) -> u32 {
    let mut b = [0u8; CRC_LEN];
    b.copy_from_slice(&crcs[i * CRC_LEN..(i + 1) * CRC_LEN]);
    u32::from_le_bytes(b)
}

/// Put `crc` at entry `i` of a buffer of little-endian entries.
pub(crate) fn set_entry(crcs: &mut [u8], i: usize, crc: u32) {
    crcs[i * CRC_LEN..(i + 1) * CRC_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Check block number `block` of `oid` against its stored checksum.
pub(crate) fn verify(oid: ObjectId, block: u64, data: &[u8], stored: u32) -> Result<(), Error> {
    let computed = stored_crc(data);
    if computed == stored {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Corrupt,
        format!(
            "object {oid} block {block}: checksum mismatch (stored {stored:08x}, data {computed:08x})"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::VdiId;

    #[test]
    fn test_zero_block_stores_zero() {
        assert_eq!(crc32c::crc32c(&[0u8; BLOCK]), ZERO_BLOCK_CRC);
        assert_eq!(stored_crc(&[0u8; BLOCK]), 0);
        let mut one = [0u8; BLOCK];
        one[17] = 1;
        assert_ne!(stored_crc(&one), 0);
    }

    #[test]
    fn test_verify_names_object_and_block() {
        let oid = ObjectId::new(VdiId(7), 3);
        let block = [5u8; BLOCK];
        assert!(verify(oid, 9, &block, stored_crc(&block)).is_ok());
        let e = verify(oid, 9, &block, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("0000000700000003"));
        assert!(e.message().contains("block 9"));
    }

    #[test]
    fn test_entries_round_trip() {
        let mut buf = [0u8; 3 * CRC_LEN];
        set_entry(&mut buf, 1, 0xdead_beef);
        assert_eq!(entry(&buf, 1), 0xdead_beef);
        assert_eq!(entry(&buf, 0), 0);
        assert_eq!(entry(&buf, 2), 0);
    }
}
