//! `drove token create|list|delete`: tokens of the admin API, for clusters whose
//! nodes run with `--admin-token-file` (`drove up --auth`).
use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use drove_daemon::api::{check_token_name, Role, TokenCreate, TokenCreated, TokenInfo};

use crate::client::{print_json, Ctx};
use crate::table;

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Make a token and print its secret, once: the cluster keeps only its SHA-256.
    /// Send it with DROVE_TOKEN=SECRET, or put it in a file (mode 0600) named by
    /// DROVE_TOKEN_FILE or --token-file. Over HTTPS a client certificate of the
    /// cluster CA whose common name is the token's name has its role too, without
    /// the secret. Needs an admin token.
    Create {
        /// Its name (1 to 64 letters, digits, '-', '_', '.' or '@'): a client certificate
        /// of this name (its CN) has the token's role.
        name: String,
        /// What it may do: read-only (status, health, lists, info, metrics),
        /// operator (also create VDIs, snapshots and clones, checks, vdi sync) or
        /// admin (everything, tokens included).
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// The tokens: name, role and when each was made (never the secrets).
    List,
    /// Delete a token: requests that carry it are refused from then on.
    Delete {
        /// Its name.
        name: String,
    },
}

/// `--role` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    ReadOnly,
    Operator,
    Admin,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::ReadOnly => Role::ReadOnly,
            RoleArg::Operator => Role::Operator,
            RoleArg::Admin => Role::Admin,
        }
    }
}

pub async fn run(cmd: TokenCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        TokenCmd::Create { name, role } => {
            check_token_name(&name).map_err(crate::fail::invalid)?;
            let body = TokenCreate {
                name,
                role: role.into(),
            };
            let t: TokenCreated = ctx.post("/api/tokens", &body).await?;
            if ctx.json {
                return print_json(&t);
            }
            println!("token '{}' ({}): {}", t.name, t.role.name(), t.token);
            eprintln!(
                "Keep the secret now: it is not shown again. Use it as DROVE_TOKEN=SECRET, \
                 or in a file (mode 0600) given to --token-file or DROVE_TOKEN_FILE."
            );
            Ok(())
        }
        TokenCmd::List => {
            let all: Vec<TokenInfo> = ctx.get("/api/tokens").await?;
            if ctx.json {
                return print_json(&all);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.role.name().to_string(),
                        (t.created_ms / 1000).to_string(),
                    ]
                })
                .collect();
            table::print(&["NAME", "ROLE", "CREATED (UNIX)"], &rows);
            Ok(())
        }
        TokenCmd::Delete { name } => {
            check_token_name(&name).map_err(crate::fail::invalid)?;
            let v: serde_json::Value = ctx.delete(&format!("/api/tokens/{name}")).await?;
            if ctx.json {
                return print_json(&v);
            }
            println!("token '{name}' deleted");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client certificate has the role of the token of its name: every name
    /// `drove cert client` takes, `drove token create` takes, and the other way.
    #[test]
    fn test_token_and_certificate_names_follow_one_rule() {
        let ca = drove_tls::Ca::generate("t", 1).unwrap();
        let long = "a".repeat(65);
        for name in [
            "alice@example.com",
            "host-a",
            "a.b_c",
            "x",
            "",
            "a b",
            "a/b",
            "a:b",
            "é",
            &long,
        ] {
            assert_eq!(
                check_token_name(name).is_ok(),
                ca.issue_client(name, 1).is_ok(),
                "{name:?}"
            );
        }
    }
}
