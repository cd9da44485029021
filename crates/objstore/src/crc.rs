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

/// The content digest of a copy from its blocks' stored values, given as a buffer
/// of little-endian entries in block order (see [`crate::content_crc`]).
pub(crate) fn digest_entries(entries: &[u8]) -> u32 {
    crc32c::crc32c(entries)
}

/// The content digest of `len` bytes of zeros (a missing object): every entry 0.
pub(crate) fn zeros_digest(len: u64) -> u32 {
    let mut left = len.div_ceil(BLOCK_SIZE) * CRC_LEN as u64;
    let mut crc = 0;
    while left > 0 {
        let n = left.min(crate::sys::ZEROS.len() as u64) as usize;
        crc = crc32c::crc32c_append(crc, &crate::sys::ZEROS[..n]);
        left -= n as u64;
    }
    crc
}

/// The content digest of `data`, computed from the data (a last partial block
/// counts as padded with zeros).
pub(crate) fn data_digest(data: &[u8]) -> u32 {
    let mut crc = 0;
    for block in data.chunks(BLOCK) {
        let v = if block.len() == BLOCK {
            stored_crc(block)
        } else {
            let mut padded = [0u8; BLOCK];
            padded[..block.len()].copy_from_slice(block);
            stored_crc(&padded)
        };
        crc = crc32c::crc32c_append(crc, &v.to_le_bytes());
    }
    crc
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
    fn test_digests_from_data_from_entries_and_of_zeros_agree() {
        let mut data = vec![0u8; 5 * BLOCK];
        data[BLOCK + 3] = 9;
        data[4 * BLOCK] = 1;
        let mut entries = vec![0u8; 5 * CRC_LEN];
        for (i, b) in data.chunks(BLOCK).enumerate() {
            set_entry(&mut entries, i, stored_crc(b));
        }
        assert_eq!(data_digest(&data), digest_entries(&entries));
        let zeros = vec![0u8; 5 * BLOCK];
        assert_eq!(data_digest(&zeros), zeros_digest(5 * BLOCK as u64));
        assert_ne!(data_digest(&data), data_digest(&zeros));
        // Past the 64 KiB of zeros zeros_digest works from: 4 MiB, 1,024 entries.
        let big = vec![0u8; 4 << 20];
        assert_eq!(data_digest(&big), zeros_digest(4 << 20));
        // A last partial block counts as padded with zeros.
        assert_eq!(data_digest(&data[..4 * BLOCK + 1]), data_digest(&data));
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
