//! Tests of wire ranges: the choice, the announcement, the test override.
use super::*;

#[test]
fn test_the_highest_common_version_is_chosen() {
    let r = |min, max| WireRange { min, max };
    assert_eq!(r(4, 5).common(&r(4, 5)), Some(5));
    assert_eq!(r(4, 5).common(&r(4, 4)), Some(4));
    assert_eq!(r(4, 4).common(&r(4, 9)), Some(4));
    assert_eq!(r(5, 7).common(&r(3, 6)), Some(6));
    assert_eq!(r(4, 4).common(&r(5, 5)), None);
    assert_eq!(r(6, 7).common(&r(4, 5)), None);
}

#[test]
fn test_a_version_4_hello_has_no_range_and_means_4_alone() {
    assert!(WireRange::only(4).encode().is_empty());
    assert_eq!(WireRange::decode(&[]), Ok(None));
    let both = WireRange::BUILD.encode();
    assert_eq!(both, vec![4, 5], "postcard: min then max, one byte each");
    assert_eq!(WireRange::decode(&both), Ok(Some(WireRange::BUILD)));
    // A later version may append to the range; the range still reads.
    assert_eq!(
        WireRange::decode(&[4, 6, 0xff, 1]),
        Ok(Some(WireRange { min: 4, max: 6 }))
    );
}

#[test]
fn test_a_range_no_ranged_node_could_send_is_refused() {
    for bytes in [vec![5u8, 4], vec![4, 4], vec![4]] {
        assert!(WireRange::decode(&bytes).is_err(), "{bytes:?}");
    }
}

#[test]
fn test_the_test_range_must_lie_within_the_build() {
    let b = WireRange::BUILD;
    assert_eq!(WireRange::parse_within("4-4", b), Ok(WireRange::only(4)));
    assert_eq!(WireRange::parse_within("5", b), Ok(WireRange::only(5)));
    assert_eq!(WireRange::parse_within(" 4 - 5 ", b), Ok(b));
    for bad in ["3-4", "5-6", "5-4", "x", "", "4-"] {
        let err = WireRange::parse_within(bad, b).unwrap_err();
        assert!(err.starts_with(TEST_RANGE_ENV), "{bad}: {err}");
    }
}

#[test]
fn test_a_mend_read_goes_to_a_version_4_node_as_the_plain_read_it_knows() {
    use crate::PeerReq;
    use drove_types::{Epoch, ObjectId, VdiId};
    let oid = ObjectId::new(VdiId(3), 1);
    let mend = PeerReq::MendRead {
        oid,
        offset: 4096,
        len: 4096,
        epoch: Epoch(2),
    };
    assert_eq!(mend.since(), 5);
    assert_eq!(mend.clone().in_version(5), mend);
    let read = PeerReq::Read {
        oid,
        offset: 4096,
        len: 4096,
        epoch: Epoch(2),
    };
    assert_eq!(mend.in_version(4), read);
    assert_eq!(read.since(), 4);
    assert_eq!(read.clone().in_version(4), read);
}
