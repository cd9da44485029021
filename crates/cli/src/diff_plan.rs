//! What `drove vdi export-diff` compares, decided from the VDI table and the bytes
//! alone (no I/O): which VDI ids' objects may differ between two snapshots
//! ([`plan`]), and which blocks of one object go into the diff ([`changed_runs`]).
use anyhow::{bail, Result};
use drove_types::{VdiId, VdiInfo};

/// Blocks compared: a block that differs is written whole.
pub(crate) const BLOCK: usize = 64 << 10;

/// A run of consecutive differing blocks of one object, offsets relative to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Run {
    /// TO's bytes.
    Data { offset: u64, data: Vec<u8> },
    /// TO reads zeros here.
    Zero { offset: u64, len: u64 },
}

/// The blocks of one object (`new` as TO reads, `old` as FROM reads, the same
/// length) to write: runs of consecutive differing [`BLOCK`]s, each as data, or as
/// zeros where TO reads zeros. Offsets are relative to the object.
pub(crate) fn changed_runs(new: &[u8], old: &[u8]) -> Vec<Run> {
    debug_assert_eq!(new.len(), old.len());
    let mut out: Vec<Run> = Vec::new();
    let mut p = 0;
    while p < new.len() {
        let e = (p + BLOCK).min(new.len());
        let (n, o) = (&new[p..e], &old[p..e]);
        if n != o {
            let zero = n.iter().all(|&b| b == 0);
            let offset = p as u64;
            match out.last_mut() {
                Some(Run::Zero { offset: at, len }) if zero && *at + *len == offset => {
                    *len += n.len() as u64;
                }
                Some(Run::Data { offset: at, data })
                    if !zero && *at + data.len() as u64 == offset =>
                {
                    data.extend_from_slice(n);
                }
                _ if zero => out.push(Run::Zero {
                    offset,
                    len: n.len() as u64,
                }),
                _ => out.push(Run::Data {
                    offset,
                    data: n.to_vec(),
                }),
            }
        }
        p = e;
    }
    out
}

/// What export-diff compares: the two snapshots, and the ids whose objects may
/// differ between them.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The older snapshot (none: a full diff).
    pub(crate) from: Option<VdiInfo>,
    /// The newer snapshot.
    pub(crate) to: VdiInfo,
    /// TO's id and its parents' up to, not including, FROM's (all of them without
    /// FROM): the only ids whose objects can read differently in TO and FROM.
    pub(crate) ids: Vec<VdiId>,
}

/// `v` and its parents, nearest first (bounded by the table's size, so a broken
/// parent link cannot loop).
pub(crate) fn chain<'a>(vdis: &'a [VdiInfo], v: &'a VdiInfo) -> Vec<&'a VdiInfo> {
    let mut out = vec![v];
    let mut cur = v.parent;
    while let Some(p) = cur.and_then(|id| vdis.iter().find(|x| x.id == id)) {
        if out.len() > vdis.len() {
            break;
        }
        out.push(p);
        cur = p.parent;
    }
    out
}

/// Work out what `export-diff NAME --from FROM --to TO` compares, from the VDI table.
pub(crate) fn plan(vdis: &[VdiInfo], name: &str, from: Option<&str>, to: &str) -> Result<Plan> {
    let find = |n: &str| vdis.iter().find(|v| v.name == n);
    let Some(vdi) = find(name) else {
        bail!("No VDI named '{name}'");
    };
    let Some(to_v) = find(to) else {
        bail!("No snapshot named '{to}'");
    };
    if !to_v.snapshot {
        bail!(
            "'{to}' is not a snapshot (a VDI being written cannot be compared): take one with `drove vdi snapshot {to} SNAP` and pass --to SNAP"
        );
    }
    if !chain(vdis, vdi).iter().any(|v| v.id == to_v.id) {
        bail!("'{to}' is not a snapshot of '{name}' (see `drove vdi tree`)");
    }
    let up = chain(vdis, to_v);
    let from_v = match from {
        None => None,
        Some(f) => {
            let Some(f_v) = find(f) else {
                bail!("No snapshot named '{f}'");
            };
            if !f_v.snapshot {
                bail!("'{f}' is not a snapshot");
            }
            if f_v.id == to_v.id || !up.iter().any(|v| v.id == f_v.id) {
                bail!("'{f}' is not an older snapshot of '{to}' (see `drove vdi tree`)");
            }
            Some(f_v.clone())
        }
    };
    let ids: Vec<VdiId> = up
        .iter()
        .take_while(|v| from_v.as_ref().is_none_or(|f| f.id != v.id))
        .map(|v| v.id)
        .collect();
    if let Some(v) = up.iter().find(|v| v.object_size != to_v.object_size) {
        bail!(
            "'{}' has objects of {} bytes and '{to}' of {}: cannot compare them",
            v.name,
            v.object_size,
            to_v.object_size
        );
    }
    Ok(Plan {
        from: from_v,
        to: to_v.clone(),
        ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vdi(id: u32, name: &str, parent: Option<u32>, snapshot: bool) -> VdiInfo {
        VdiInfo {
            parent: parent.map(VdiId),
            snapshot,
            ..VdiInfo::new(VdiId(id), name, 64 << 20, 4 << 20, 3)
        }
    }

    /// base <- s1 <- s2 <- vm (the live VDI), and a clone c of s1.
    fn table() -> Vec<VdiInfo> {
        vec![
            vdi(1, "s1", None, true),
            vdi(2, "s2", Some(1), true),
            vdi(3, "vm", Some(2), false),
            vdi(4, "c", Some(1), false),
        ]
    }

    #[test]
    fn test_the_plan_takes_the_ids_between_the_two_snapshots() {
        let t = table();
        let p = plan(&t, "vm", Some("s1"), "s2").unwrap();
        assert_eq!(p.ids, vec![VdiId(2)]);
        assert_eq!(p.from.unwrap().name, "s1");
        let full = plan(&t, "vm", None, "s2").unwrap();
        assert_eq!(full.ids, vec![VdiId(2), VdiId(1)]);
        assert!(full.from.is_none());
    }

    #[test]
    fn test_the_plan_refuses_what_cannot_be_compared() {
        let t = table();
        let err = |r: Result<Plan>| r.unwrap_err().to_string();
        assert!(err(plan(&t, "nope", None, "s1")).contains("No VDI named 'nope'"));
        assert!(err(plan(&t, "vm", None, "nope")).contains("No snapshot named"));
        assert!(err(plan(&t, "vm", None, "vm")).contains("not a snapshot"));
        // s2 is not in c's lineage.
        assert!(err(plan(&t, "c", None, "s2")).contains("not a snapshot of 'c'"));
        // FROM must be older than TO, and not TO itself.
        assert!(err(plan(&t, "vm", Some("s2"), "s1")).contains("not an older snapshot"));
        assert!(err(plan(&t, "vm", Some("s2"), "s2")).contains("not an older snapshot"));
        assert!(err(plan(&t, "vm", Some("c"), "s2")).contains("'c' is not a snapshot"));
    }

    #[test]
    fn test_changed_runs_write_only_differing_blocks_merged_by_kind() {
        let b = BLOCK;
        let old = vec![7u8; 6 * b];
        let mut new = old.clone();
        new[b..b + 10].fill(1); // block 1: data
        new[2 * b..3 * b].fill(9); // block 2: data, merged with block 1
        new[4 * b..6 * b].fill(0); // blocks 4 and 5: zeros, merged
        let runs = changed_runs(&new, &old);
        assert_eq!(
            runs.len(),
            2,
            "{:?}",
            runs.iter()
                .map(|r| match r {
                    Run::Data { offset, data } => format!("w {offset} {}", data.len()),
                    Run::Zero { offset, len } => format!("z {offset} {len}"),
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(
            runs[0],
            Run::Data {
                offset: b as u64,
                data: new[b..3 * b].to_vec()
            }
        );
        assert_eq!(
            runs[1],
            Run::Zero {
                offset: 4 * b as u64,
                len: 2 * b as u64
            }
        );
        assert!(changed_runs(&old, &old).is_empty());
        // A short last block (the VDI's end) is compared too.
        let (o, mut n) = (vec![0u8; b + 100], vec![0u8; b + 100]);
        n[b + 50] = 1;
        assert_eq!(
            changed_runs(&n, &o),
            vec![Run::Data {
                offset: b as u64,
                data: n[b..].to_vec()
            }]
        );
    }
}
