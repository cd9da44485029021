//! Human sizes: `512`, `4K`, `1.5G`, `2T`, `1P` (powers of 1024), and back.
use crate::{Error, Result};

/// Parse a size with an optional K/M/G/T/P suffix (binary units; `B`, `iB` accepted).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let bad = || {
        Error::invalid(format!(
            "Bad size '{s}': use a number with an optional K, M, G, T or P suffix, like 10G"
        ))
    };
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (num, mult): (&str, u64) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 1 << 10),
        Some('M') => (&body[..body.len() - 1], 1 << 20),
        Some('G') => (&body[..body.len() - 1], 1 << 30),
        Some('T') => (&body[..body.len() - 1], 1 << 40),
        Some('P') => (&body[..body.len() - 1], 1 << 50),
        Some(_) => (body, 1),
        None => return Err(bad()),
    };
    let num = num.trim();
    if num.is_empty() || num.starts_with('-') || num.starts_with('+') {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let v = f * mult as f64;
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

/// Format bytes with the largest binary unit that keeps one decimal, like `1.5G`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("P", 1 << 50),
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit {
            if bytes.is_multiple_of(unit) {
                return format!("{}{name}", bytes / unit);
            }
            return format!("{:.1}{name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_size_suffixes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
    }

    #[test]
    fn test_parse_size_takes_pebibytes() {
        assert_eq!(parse_size("1P").unwrap(), 1 << 50);
        assert_eq!(parse_size("1PiB").unwrap(), 1 << 50);
        assert_eq!(parse_size("0.5p").unwrap(), 1 << 49);
        assert_eq!(format_size(1 << 50), "1P");
        assert_eq!(format_size(3 << 49), "1.5P");
    }

    #[test]
    fn test_parse_size_rejects_garbage() {
        for s in ["", "G", "-1G", "abc", "1X", "99999999999999T", "1..5G"] {
            assert!(parse_size(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn test_format_size() {
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(3 << 19), "1.5M");
        assert_eq!(format_size(100), "100");
    }

    proptest::proptest! {
        #[test]
        fn test_format_then_parse_is_close(n in 0u64..(1u64 << 50)) {
            let back = parse_size(&format_size(n)).unwrap();
            let err = back.abs_diff(n) as f64;
            proptest::prop_assert!(err <= (n as f64) * 0.05 + 1.0);
        }
    }
}
