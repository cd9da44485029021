//! What a data directory was made for: a data node or a witness, kept in
//! `DIR/role` and checked at every start.
//!
//! A witness restarted without `--witness` (a unit file edited by hand, a
//! command line typed again) used to come back as a data node: the metadata took
//! its new record (weight, NBD port), placement started putting copies in the
//! witness's zone, and nothing said so. The reverse would turn a node holding
//! copies into one that serves none. Each is a change of the node's job, which an
//! operator makes by taking the node out (`drove node leave`) and starting the new
//! one on an empty directory, never by a flag that went missing. So the first start
//! writes the role into the directory, and a later start with the other role is
//! refused, naming both and the way to make the change.
//!
//! A directory from a drove before this file existed has no role: it takes the
//! role it is started with next.
use drove_types::{private_fs, Error, Result};
use std::path::Path;

/// The file, inside the data directory.
pub const FILE: &str = "role";

/// A node's job, as written in the file.
fn name(witness: bool) -> &'static str {
    if witness {
        "witness"
    } else {
        "data"
    }
}

/// Check that data directory `dir` (held by this process) was made for the role
/// this start asks for (`witness`), and record it there if it has none yet.
pub fn check(dir: &Path, witness: bool) -> Result<()> {
    let path = dir.join(FILE);
    let want = name(witness);
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let had = s.trim();
            if had == want {
                return Ok(());
            }
            Err(Error::invalid(match had {
                "witness" => format!(
                    "The data directory {} belongs to a witness, and this node was started \
                         without --witness. Start it with --witness; to make this host a data \
                         node, take the witness out of the cluster (`drove node leave ID`) and \
                         start the data node on an empty directory",
                    dir.display()
                ),
                "data" => format!(
                    "The data directory {} belongs to a data node, and this node was \
                         started with --witness, which holds no objects. Start it without \
                         --witness; to make this host a witness, take the node out of the \
                         cluster (`drove node leave ID` copies its objects to the others) and \
                         start the witness on an empty directory",
                    dir.display()
                ),
                other => format!(
                    "The data directory's role file {} says '{}', neither 'data' nor \
                         'witness'; write the role this directory was made for into it",
                    path.display(),
                    other.escape_debug()
                ),
            }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => record(dir, want),
        Err(e) => Err(Error::io(format!("Cannot read {}", path.display()), e)),
    }
}

/// Write `role` so that a power loss leaves the file whole or absent.
fn record(dir: &Path, role: &str) -> Result<()> {
    let path = dir.join(FILE);
    private_fs::replace_durably(&path, format!("{role}\n").as_bytes())
        .map_err(|e| Error::io(format!("Cannot write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::ErrorKind;

    #[test]
    fn test_the_first_start_records_the_role_and_the_same_role_starts_again() {
        let d = tempfile::tempdir().unwrap();
        check(d.path(), true).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join(FILE)).unwrap(),
            "witness\n"
        );
        check(d.path(), true).unwrap();
        let e = tempfile::tempdir().unwrap();
        check(e.path(), false).unwrap();
        check(e.path(), false).unwrap();
        assert_eq!(
            std::fs::read_to_string(e.path().join(FILE)).unwrap(),
            "data\n"
        );
    }

    #[test]
    fn test_a_witness_directory_refuses_a_data_node_and_the_reverse() {
        let d = tempfile::tempdir().unwrap();
        check(d.path(), true).unwrap();
        let e = check(d.path(), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(
            e.message().contains("belongs to a witness") && e.message().contains("--witness"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        check(d.path(), false).unwrap();
        let e = check(d.path(), true).unwrap_err();
        assert!(e.message().contains("belongs to a data node"), "{e}");
        // The refusal changed nothing.
        assert_eq!(
            std::fs::read_to_string(d.path().join(FILE)).unwrap(),
            "data\n"
        );
    }

    #[test]
    fn test_an_unknown_role_is_refused_with_what_the_file_says() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(FILE), "gateway\n").unwrap();
        let e = check(d.path(), false).unwrap_err();
        assert!(e.message().contains("'gateway'"), "{e}");
    }
}
