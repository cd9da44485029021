//! Helpers the store's test files share: walking a store's directory.
use std::fs;
use std::path::{Path, PathBuf};

/// Every file under `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The one file under `dir` whose name is `name`.
pub fn find(dir: &Path, name: &str) -> PathBuf {
    files_under(dir)
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == name))
        .unwrap_or_else(|| panic!("no file {name} under {}", dir.display()))
}
