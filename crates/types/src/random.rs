//! The random numbers a node draws (its run's incarnation, request ids, a new
//! cluster's id, openraft's election timeouts): from the operating system, except
//! on a thread whose simulated run seeded them ([`seed_thread`]), where they come
//! from that seed, so that a seed replays byte for byte.
use std::cell::Cell;

thread_local! {
    /// On a simulator's thread: the state of its generator (splitmix64).
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// From now on, this thread's random numbers follow `seed`.
pub fn seed_thread(seed: u64) {
    SEEDED.with(|s| s.set(Some(seed)));
}

/// Back to the operating system's random numbers on this thread.
pub fn unseed_thread() {
    SEEDED.with(|s| s.set(None));
}

/// Whether this thread's random numbers are seeded (a simulation).
pub fn seeded() -> bool {
    SEEDED.with(|s| s.get().is_some())
}

/// A random `u64`.
pub fn u64() -> u64 {
    if let Some(next) = SEEDED.with(|s| {
        s.get().map(|x| {
            let x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(Some(x));
            splitmix(x)
        })
    }) {
        return next;
    }
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No OS randomness: std's hasher keys are random per process and time moves.
        use std::hash::BuildHasher;
        return std::collections::hash_map::RandomState::new()
            .hash_one((std::time::SystemTime::now(), std::process::id()));
    }
    u64::from_le_bytes(b)
}

/// Fill `buf` with random bytes.
pub fn fill(buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        let r = u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_seeded_thread_draws_the_same_numbers_every_time() {
        std::thread::spawn(|| {
            seed_thread(42);
            let a: Vec<u64> = (0..4).map(|_| u64()).collect();
            seed_thread(42);
            let b: Vec<u64> = (0..4).map(|_| u64()).collect();
            assert_eq!(a, b);
            assert!(a.windows(2).all(|w| w[0] != w[1]));
            let mut buf = [0u8; 11];
            fill(&mut buf);
            assert_ne!(buf, [0u8; 11]);
            unseed_thread();
            assert!(!seeded());
            assert_ne!(u64(), u64());
        })
        .join()
        .unwrap();
    }
}
