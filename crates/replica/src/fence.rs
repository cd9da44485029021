//! Fencing: a replica refuses a write whose lock generation is older than the newest
//! it knows for that VDI. It learns generations from the metadata (every lock the
//! cluster hands out) and from the writes themselves (a new gateway's first write
//! raises the bar even before this node has applied the new lock), so a cut-off old
//! gateway that still thinks it holds the lock cannot overwrite the new one's data.
use drove_types::{Error, ErrorKind, Result, VdiId};
use parking_lot::Mutex;
use std::collections::HashMap;

/// The newest lock generation known per VDI.
#[derive(Default)]
pub struct Fence(Mutex<HashMap<VdiId, u64>>);

impl Fence {
    /// Raise the bar for `vdi` to `generation` (never lowers it).
    pub fn raise(&self, vdi: VdiId, generation: u64) {
        let mut m = self.0.lock();
        let g = m.entry(vdi).or_insert(0);
        *g = (*g).max(generation);
    }

    /// Admit a write of `vdi` carrying `generation`, raising the bar to it; refuse
    /// it with `Locked` when a newer generation is known (another gateway holds the
    /// VDI's lock now; `StaleEpoch` is kept for cluster-map epochs, which a gateway
    /// answers by retrying on the newer map).
    pub fn admit(&self, vdi: VdiId, generation: u64) -> Result<()> {
        let mut m = self.0.lock();
        let g = m.entry(vdi).or_insert(0);
        if generation < *g {
            return Err(Error::new(
                ErrorKind::Locked,
                format!(
                    "Write to VDI {vdi} refused: lock generation {generation} is older than {}",
                    *g
                ),
            ));
        }
        *g = generation;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_older_generation_is_refused_newer_raises_the_bar() {
        let f = Fence::default();
        let v = VdiId(1);
        f.admit(v, 1).unwrap();
        f.admit(v, 2).unwrap();
        assert_eq!(f.admit(v, 1).unwrap_err().kind(), ErrorKind::Locked);
        f.raise(v, 5);
        assert!(f.admit(v, 4).is_err());
        f.admit(v, 5).unwrap();
        f.raise(v, 3);
        f.admit(v, 5).unwrap();
        f.admit(VdiId(2), 0).unwrap();
    }
}
