//! `drove cert ca|node|client`: a cluster CA and the certificates it signs, for a
//! real deployment (`drove up` makes the same files for a local cluster).
//! Every file is written with mode 0600 and none is ever replaced.
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use drove_tls::{Ca, NodeNames};
use serde::Serialize;
use std::path::{Path, PathBuf};

use crate::client::{print_json, Ctx};

#[derive(Subcommand)]
pub enum CertCmd {
    /// Create a cluster CA: OUT/ca-cert.pem and OUT/ca-key.pem. Keep the key
    /// private: whoever has it can make certificates every node trusts. To use a CA
    /// of your own instead, put its certificate and key in a directory under those
    /// two names and pass it to `--ca`.
    Ca {
        /// Directory to write to (made with mode 0700 if new).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The CA's name (its certificate's CN).
        #[arg(long, default_value = "drove-ca")]
        name: String,
        /// Days the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a node certificate: OUT/ca-cert.pem, OUT/server-cert.pem and
    /// OUT/server-key.pem, the directory `drove node run --tls-dir` takes. It is
    /// valid for server and client authentication, for every --host and for the
    /// name `drove-node`.
    Node {
        #[command(flatten)]
        common: Common,
        /// IP address or DNS name clients reach the node by (repeat, or list several).
        #[arg(long = "host", value_name = "IP_OR_NAME", required = true, num_args = 1..)]
        hosts: Vec<String>,
    },
    /// Issue a client certificate: OUT/ca-cert.pem, OUT/client-cert.pem and
    /// OUT/client-key.pem, the directory QEMU's
    /// `--object tls-creds-x509,id=tls0,endpoint=client,dir=OUT` and libnbd's
    /// `nbds://HOST:PORT/VDI?tls-certificates=OUT` (nbdinfo, nbdcopy) read.
    Client {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
pub struct Common {
    /// The CA directory (ca-cert.pem, ca-key.pem).
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// The certificate's name (its CN): 1 to 64 letters, digits, - _ . @; it has the
    /// role of the admin API token of the same name (`drove token create NAME`).
    #[arg(long)]
    name: String,
    /// Directory to write to (made with mode 0700 if new).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 825)]
    days: u32,
}

/// What was written, for `--json`.
#[derive(Serialize)]
struct Written {
    kind: &'static str,
    name: String,
    hosts: Vec<String>,
    files: Vec<String>,
    /// Expiry, YYYY-MM-DD (UTC).
    expires: String,
}

pub async fn run(cmd: CertCmd, ctx: &Ctx) -> Result<()> {
    let w = match cmd {
        CertCmd::Ca { out, name, days } => {
            let ca = Ca::generate(&name, days)?;
            let files = ca.write(&out)?;
            Written {
                kind: "ca",
                name,
                hosts: Vec::new(),
                files: files.iter().map(|p| p.display().to_string()).collect(),
                expires: date(days_from_now(days)),
            }
        }
        CertCmd::Node { common: c, hosts } => {
            let ca = load_ca(&c.ca)?;
            let names = NodeNames {
                name: c.name.clone(),
                hosts: hosts.clone(),
            };
            let issued = ca.issue_node(&names, c.days)?;
            let files = issued.write_node(&ca, &c.out)?;
            Written {
                kind: "node",
                name: c.name,
                hosts,
                files: files.iter().map(|p| p.display().to_string()).collect(),
                expires: date(issued.not_after),
            }
        }
        CertCmd::Client { common: c } => {
            let ca = load_ca(&c.ca)?;
            let issued = ca.issue_client(&c.name, c.days)?;
            let files = issued.write_client(&ca, &c.out)?;
            Written {
                kind: "client",
                name: c.name,
                hosts: Vec::new(),
                files: files.iter().map(|p| p.display().to_string()).collect(),
                expires: date(issued.not_after),
            }
        }
    };
    if ctx.json {
        return print_json(&w);
    }
    println!(
        "{} certificate '{}' valid until {}:",
        w.kind, w.name, w.expires
    );
    for f in &w.files {
        println!("  {f}");
    }
    Ok(())
}

fn load_ca(dir: &Path) -> Result<Ca> {
    Ca::load(dir).with_context(|| format!("Cannot use the CA in {}", dir.display()))
}

fn days_from_now(days: u32) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(i64::from(days.max(1)))
}

fn date(t: time::OffsetDateTime) -> String {
    format!("{}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day())
}
