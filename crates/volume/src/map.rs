//! Byte range → object extents. Pure arithmetic, property-tested.

/// The part of a request that falls in one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Object index in the VDI.
    pub index: u32,
    /// Offset inside the object.
    pub offset: u64,
    /// Length inside the object.
    pub len: u64,
    /// Offset of this extent inside the request's buffer.
    pub buf_offset: u64,
}

/// Cut `[offset, offset+len)` into per-object extents, in order. `object_size` > 0.
pub fn extents(object_size: u64, offset: u64, len: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset.saturating_add(len);
    while pos < end {
        let index = pos / object_size;
        let in_obj = pos % object_size;
        let n = (object_size - in_obj).min(end - pos);
        out.push(Extent {
            index: index as u32,
            offset: in_obj,
            len: n,
            buf_offset: pos - offset,
        });
        pos += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_crossing_an_object_boundary_gives_two_extents() {
        let e = extents(4096, 4000, 200);
        assert_eq!(
            e,
            vec![
                Extent {
                    index: 0,
                    offset: 4000,
                    len: 96,
                    buf_offset: 0
                },
                Extent {
                    index: 1,
                    offset: 0,
                    len: 104,
                    buf_offset: 96
                },
            ]
        );
    }

    proptest! {
        #[test]
        fn test_extents_tile_the_range(osz in 1u64..10_000, off in 0u64..1_000_000, len in 0u64..100_000) {
            let e = extents(osz, off, len);
            let total: u64 = e.iter().map(|x| x.len).sum();
            prop_assert_eq!(total, len);
            let mut expect_buf = 0;
            for x in &e {
                prop_assert_eq!(x.buf_offset, expect_buf);
                prop_assert_eq!(u64::from(x.index) * osz + x.offset, off + x.buf_offset);
                prop_assert!(x.offset + x.len <= osz);
                prop_assert!(x.len > 0);
                expect_buf += x.len;
            }
        }
    }
}
