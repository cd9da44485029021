//! PNG bar charts in the style of the paper's figures, drawn by
//! bench/paper_charts.py (python3 + matplotlib, Agg backend) from results.csv and
//! indexes.csv. The script is built into the binary (written to a hidden file next
//! to the results for the run, then removed) so the harness works from any
//! directory. Without matplotlib the charts are skipped and
//! the report says so; nothing is drawn another way.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// bench/paper_charts.py.
pub const SCRIPT: &str = include_str!("../../../bench/paper_charts.py");

/// Whether python3 can import matplotlib; the reason when it cannot.
pub fn matplotlib_missing() -> Option<String> {
    match Command::new("python3")
        .args(["-c", "import matplotlib"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        Ok(_) => Some(
            "matplotlib is not installed for python3 (scripts/install-deps.sh installs it)"
                .to_string(),
        ),
        Err(_) => Some("python3 is not installed".to_string()),
    }
}

/// Draw the charts into `out` (which holds results.csv and indexes.csv). Returns
/// the PNGs written, or why there are none.
pub fn render(out: &Path) -> Result<Vec<PathBuf>, String> {
    if let Some(why) = matplotlib_missing() {
        return Err(why);
    }
    let script = out.join(".paper_charts.py");
    if let Err(e) = std::fs::write(&script, SCRIPT) {
        return Err(format!("cannot write {}: {e}", script.display()));
    }
    let res = Command::new("python3")
        .arg(&script)
        .arg(out)
        .stdin(Stdio::null())
        .output();
    let _ = std::fs::remove_file(&script);
    let o = res.map_err(|e| format!("cannot run python3: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "paper_charts.py failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let pngs: Vec<PathBuf> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| out.join(l.trim()))
        .filter(|p| p.extension().is_some_and(|e| e == "png") && p.is_file())
        .collect();
    if pngs.is_empty() {
        return Err("paper_charts.py wrote no PNG".to_string());
    }
    Ok(pngs)
}
