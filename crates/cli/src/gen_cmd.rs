//! `drove generate` (hidden): man pages and shell completions made from the clap
//! definitions themselves, so they always match the binary. The Debian package's
//! build (`packaging/deb/build.sh`) runs it with the binary it packs.
use anyhow::{Context, Result};
use clap::{CommandFactory, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum GenerateCmd {
    /// Man pages (section 1) into DIR: drove.1 and one per subcommand
    /// (drove-vdi-create.1, ...).
    Man {
        /// Output directory (made if missing).
        dir: PathBuf,
    },
    /// A completion script for SHELL into DIR: drove.bash for bash, _drove for zsh.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
        /// Output directory (made if missing).
        dir: PathBuf,
    },
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("Cannot make {}", dir.display()))
}

pub fn run(cmd: GenerateCmd) -> Result<()> {
    match cmd {
        GenerateCmd::Man { dir } => {
            mkdir(&dir)?;
            clap_mangen::generate_to(crate::Cli::command(), &dir)
                .with_context(|| format!("Cannot write the man pages into {}", dir.display()))?;
        }
        GenerateCmd::Completions { shell, dir } => {
            mkdir(&dir)?;
            let path = clap_complete::generate_to(shell, &mut crate::Cli::command(), "drove", &dir)
                .with_context(|| format!("Cannot write the completions into {}", dir.display()))?;
            println!("{}", path.display());
        }
    }
    Ok(())
}
