//! `drove vdi lock ...`: the write lock of a VDI, for an operator.
use anyhow::Result;
use clap::Subcommand;
use drove_daemon::api::LockBreak;

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

#[derive(Subcommand, Debug)]
pub enum LockCmd {
    /// Take a VDI's write lock from the node holding it, for a holder that cannot
    /// give it back (a hung host, a gateway cut off from its VM). Replicas refuse the
    /// holder's writes from then on and the next writer may take the lock at once;
    /// the holder's clients get write errors and must attach again. Nothing the
    /// holder acknowledged before is lost. For a live holder prefer `drove vdi
    /// handover`, which flushes first.
    Break {
        /// VDI name.
        name: String,
    },
}

pub async fn run(cmd: LockCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        LockCmd::Break { name } => {
            let r: LockBreak = ctx
                .post(
                    &format!("/api/vdis/{}/lock/break", encode(&name)),
                    &serde_json::json!({}),
                )
                .await?;
            if ctx.json {
                return print_json(&r);
            }
            match &r.broken {
                Some(l) => println!(
                    "Broke node {}'s write lock on VDI '{name}' (generation {}): replicas \
                     refuse writes below generation {}; the lock is free",
                    l.owner, l.generation, r.fenced_below
                ),
                None => println!("Nobody held VDI '{name}''s write lock: nothing to break"),
            }
            Ok(())
        }
    }
}
