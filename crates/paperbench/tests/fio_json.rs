//! fio's JSON as real runs print it (fixtures captured from fio 3.33 with the NBD
//! engine against a drove VDI, "fio: connected to NBD server" line included).
use drove_paperbench::fio::parse_fio_json;
use drove_paperbench::Op;

const SEQWRITE: &str = include_str!("fixtures/fio-nbd-seqwrite-1M.json");
const RANDREAD: &str = include_str!("fixtures/fio-nbd-randread-4k.json");

#[test]
fn test_parse_real_fio_seqwrite_output() {
    assert!(SEQWRITE.starts_with("fio: connected to NBD server"));
    let jobs = parse_fio_json(SEQWRITE).unwrap();
    assert_eq!(jobs.len(), 1);
    let j = &jobs[0];
    assert_eq!(j.name, "c0");
    assert_eq!(j.error, 0);
    assert_eq!(j.write_bw_bytes, 231_409_875.0);
    assert_eq!(j.write_io_bytes, 64 << 20);
    assert_eq!(j.read_io_bytes, 0);
    assert!((j.write_iops - 220.689655).abs() < 1e-6);
    assert!((j.mbps(Op::BlockWrite) - 231.409875).abs() < 1e-9);
    assert_eq!(j.io_bytes(Op::SmallWrite), 64 << 20);
    // The read side of a write job is zero, not missing.
    assert_eq!(j.mbps(Op::BlockRead), 0.0);
}

#[test]
fn test_parse_real_fio_randread_output() {
    let jobs = parse_fio_json(RANDREAD).unwrap();
    let j = &jobs[0];
    assert_eq!(j.read_bw_bytes, 95_507_830.0);
    assert_eq!(j.read_io_bytes, 191_111_168);
    assert!((j.read_iops - 23317.341329).abs() < 1e-6);
    assert!((j.mbps(Op::SmallRead) - 95.50783).abs() < 1e-9);
    assert_eq!(j.write_bw_bytes, 0.0);
}

#[test]
fn test_parse_truncated_real_output_fails() {
    let cut = &RANDREAD[..RANDREAD.len() / 2];
    assert!(parse_fio_json(cut).is_err());
}
