//! The stable hash behind placement: a 64-bit mix of (node id, object id), turned
//! into a uniform value in (0, 1) and then into a rendezvous score.
//!
//! Everything here must give bit-identical results on every run, build and platform,
//! because every node computes placement on its own and they must agree. So:
//! - the mix is a fixed splitmix64-style finaliser, not std's `DefaultHasher`/
//!   `RandomState` (seeded per process, and its algorithm may change between releases);
//! - the natural logarithm is computed here from `+ - * /` only (IEEE 754 correctly
//!   rounds those, so they agree everywhere) instead of `f64::ln`, which calls the
//!   platform's libm and may differ in the last bit between platforms.
//!
//! Changing anything in this file moves almost every object: treat it like an
//! on-disk format.

/// Seed mixed into object ids, so that the object and node inputs never hash alike.
const OBJECT_SEED: u64 = 0x9e37_79b9_7f4a_7c15;
/// Seed mixed into node ids.
const NODE_SEED: u64 = 0xd1b5_4a32_d192_ed03;

/// The splitmix64 finaliser (Stafford's "Mix13"): a bijection on `u64` whose output
/// bits each depend on every input bit.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x
}

/// The 64-bit hash of the pair (node, object). Each input is mixed on its own with a
/// different seed before they are combined, so the pair is not symmetric and nearby
/// ids (node 1, 2, 3; object index 0, 1, 2) give unrelated values.
pub(crate) fn pair_hash(node: u64, object: u64) -> u64 {
    mix64(mix64(object ^ OBJECT_SEED) ^ mix64(node ^ NODE_SEED).rotate_left(23))
}

/// Maps a hash to a value strictly inside (0, 1): `(2k + 1) / 2^53` for the top 52
/// bits `k`. The numerator is below 2^53, so the conversion is exact, and the value
/// is never 0 or 1, so its logarithm is finite and negative.
pub(crate) fn unit_open(h: u64) -> f64 {
    let k = h >> 12;
    ((k << 1) | 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Natural logarithm of a positive, normal `x`, from basic arithmetic only (see the
/// module doc). Writes `x = m * 2^e` with `m` in [sqrt(1/2), sqrt(2)), then
/// `ln m = 2 atanh(s)` with `s = (m - 1) / (m + 1)`, `|s| < 0.172`; twelve terms of the
/// odd series leave an error below 1e-18, far under one ulp.
/// Callers pass only values from [`unit_open`], which are normal and positive.
pub(crate) fn ln(x: f64) -> f64 {
    const MANTISSA: u64 = (1 << 52) - 1;
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & MANTISSA) | (1023 << 52));
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // Horner form of 1 + s2/3 + s2^2/5 + ... + s2^12/25.
    let mut p = 1.0 / 25.0;
    for k in (0..12).rev() {
        p = p * s2 + 1.0 / f64::from(2 * k + 1);
    }
    e as f64 * std::f64::consts::LN_2 + 2.0 * s * p
}

/// The weighted rendezvous score of `node` for `object`: `weight / -ln(h)`, with `h`
/// uniform in (0, 1). `-ln(h)` is exponentially distributed, so `1 / score` is
/// exponential with rate `weight`, and the node with the highest score wins with
/// probability `weight / sum(weights)`: shares follow weights, and adding or removing
/// a node only changes the winner where that node wins or won.
pub(crate) fn score(node: u64, weight: u32, object: u64) -> f64 {
    f64::from(weight) / -ln(unit_open(pair_hash(node, object)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_hash_values_are_pinned() {
        // Placement must never change silently between builds: these pin the hash.
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(pair_hash(1, 0), PINNED_PAIR_1_0);
    }

    /// Computed once with an independent Python model of this file; a change here moves
    /// every object.
    const PINNED_PAIR_1_0: u64 = 0xbb1e_8bd0_2df4_68a1;

    #[test]
    fn test_unit_open_stays_inside_the_open_interval() {
        assert!(unit_open(0) > 0.0);
        assert!(unit_open(u64::MAX) < 1.0);
        assert_eq!(unit_open(0), 1.0 / (1u64 << 53) as f64);
    }

    #[test]
    fn test_ln_matches_std_on_edges() {
        for x in [
            unit_open(0),
            unit_open(u64::MAX),
            0.5,
            1.0,
            2.0,
            // Both sides of the range reduction's switch point.
            std::f64::consts::SQRT_2,
            f64::from_bits(std::f64::consts::SQRT_2.to_bits() + 1),
            std::f64::consts::FRAC_1_SQRT_2,
            1e-10,
        ] {
            let want = x.ln();
            assert!(
                (ln(x) - want).abs() <= 1e-15 * want.abs().max(1.0),
                "ln({x})"
            );
        }
        assert_eq!(ln(1.0), 0.0);
    }

    proptest! {
        #[test]
        fn test_ln_matches_std_within_rounding(h in any::<u64>()) {
            let x = unit_open(h);
            let want = x.ln();
            prop_assert!((ln(x) - want).abs() <= 4.0 * f64::EPSILON * want.abs());
        }

        #[test]
        fn test_score_is_positive_and_finite(node in any::<u64>(), obj in any::<u64>(), w in 1u32..) {
            let s = score(node, w, obj);
            prop_assert!(s.is_finite() && s > 0.0);
        }
    }
}
