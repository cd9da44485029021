//! `drove vdi access NAME [--allow CLIENT]... [--anyone]`: which clients may attach a
//! VDI over NBD on TCP, by the common name of their certificate. The unix socket is
//! not concerned (its file permissions decide). The node checks the list when a
//! client opens the VDI; connections already open stay.
use anyhow::Result;
use clap::Args;
use drove_daemon::api::{Access, VdiDetail};
use drove_types::{validate_client_names, VdiInfo};

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

#[derive(Args)]
pub struct AccessArgs {
    /// The VDI (or snapshot).
    pub name: String,
    /// Let only clients whose certificate has this common name attach over TCP
    /// (`drove cert client NAME` issues one); repeat, or separate names with commas.
    /// Replaces the list. A client without TLS is then refused. Without --allow and
    /// --anyone, the list is shown.
    #[arg(long, value_name = "CLIENT", value_delimiter = ',')]
    pub allow: Vec<String>,
    /// Let any client the NBD TCP port accepts attach (clears the list).
    #[arg(long, conflicts_with = "allow")]
    pub anyone: bool,
}

pub async fn run(a: AccessArgs, ctx: &Ctx) -> Result<()> {
    let path = format!("/api/vdis/{}", encode(&a.name));
    let d: VdiDetail = if a.allow.is_empty() && !a.anyone {
        ctx.get_consistent(&path).await?
    } else {
        validate_client_names(&a.allow)?;
        let body = Access {
            nbd_clients: a.allow,
        };
        ctx.post(&format!("{path}/access"), &body).await?
    };
    if ctx.json {
        return print_json(&d);
    }
    println!("VDI '{}': {}", d.info.name, describe(&d.info));
    Ok(())
}

/// Who may attach over TCP, as `vdi info` and `vdi access` say it.
pub fn describe(i: &VdiInfo) -> String {
    if i.nbd_clients.is_empty() {
        "any client the NBD TCP port lets in".to_string()
    } else {
        format!(
            "over TCP only clients with a certificate named {} (the unix socket: \
             whoever its file permissions let in)",
            i.nbd_clients.join(", ")
        )
    }
}
