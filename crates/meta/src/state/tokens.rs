//! Admin API tokens (`drove token create`): a name, a role, and the SHA-256 of the
//! secret. The secret itself is never stored, in the metadata or anywhere else: the
//! node that creates a token hands it to the operator once.
use serde::{Deserialize, Serialize};

use super::{invalid, ApplyResult, MetaState, Reply};
use drove_types::ErrorKind;

/// What a token may do on the admin API, each role including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Status, health, lists, VDI info, metrics: reads only.
    ReadOnly,
    /// Also what running VMs needs: create VDIs, snapshots and clones, checks.
    Operator,
    /// Everything: delete, resize, settings, nodes, locks, tokens.
    Admin,
}

impl Role {
    /// The name the CLI takes and prints.
    pub fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// One token of the admin API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    /// What it may do.
    pub role: Role,
    /// SHA-256 of the secret, lowercase hex (64 characters).
    pub sha256: String,
    /// When it was made (ms since the Unix epoch, the leader's clock).
    pub created_ms: u64,
}

/// Most tokens the metadata keeps (a forged command must not grow it without end).
pub const MAX_TOKENS: usize = 1000;

/// Longest token name.
pub const MAX_TOKEN_NAME: usize = 64;

/// Why `name` cannot name a token, if it cannot. The rule is the one for the
/// names of client certificates (`drove cert client --name`: 1 to 64 letters,
/// digits, `-`, `_`, `.` or `@`), since a client certificate has the role of the
/// token of its name: a certificate of a person is usually named by an address
/// (`alice@example.com`), and a token could not be named so. `@` is safe where
/// the name goes: a path segment of the admin API (`/api/tokens/NAME`), JSON and
/// messages.
pub fn check_token_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@');
    if name.is_empty() || name.len() > MAX_TOKEN_NAME || !name.chars().all(ok_char) {
        return Err(format!(
            "Bad token name '{}': use 1 to {MAX_TOKEN_NAME} letters, digits, '-', '_', '.' or '@' \
             (as the name of the client certificate it gives a role)",
            drove_types::shown(name)
        ));
    }
    Ok(())
}

impl MetaState {
    /// Add token `name` (see [`super::Command::AddToken`]).
    pub(super) fn add_token(
        &mut self,
        name: &str,
        role: Role,
        sha256: &str,
        now_ms: u64,
    ) -> ApplyResult {
        check_token_name(name).map_err(invalid)?;
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if sha256.len() != 64 || !sha256.chars().all(hex) {
            return Err(invalid(
                "Bad token hash: 64 lowercase hex digits (SHA-256) expected".to_string(),
            ));
        }
        if self.tokens.contains_key(name) {
            return Err((
                ErrorKind::AlreadyExists,
                format!(
                    "A token named '{name}' exists; delete it first",
                    name = drove_types::shown(name)
                ),
            ));
        }
        if self.tokens.values().any(|t| t.sha256 == sha256) {
            return Err(invalid("Another token has the same secret".to_string()));
        }
        if self.tokens.len() >= MAX_TOKENS {
            return Err(invalid(format!(
                "Too many tokens: at most {MAX_TOKENS}; delete unused ones first"
            )));
        }
        self.tokens.insert(
            name.to_string(),
            ApiToken {
                role,
                sha256: sha256.to_string(),
                created_ms: now_ms,
            },
        );
        Ok(Reply::Done)
    }

    /// Remove token `name`.
    pub(super) fn remove_token(&mut self, name: &str) -> ApplyResult {
        match self.tokens.remove(name) {
            Some(_) => Ok(Reply::Done),
            None => Err((
                ErrorKind::NotFound,
                format!("No token named '{name}'", name = drove_types::shown(name)),
            )),
        }
    }

    /// The name and role of the token whose secret hashes to `sha256`.
    pub fn token_by_hash(&self, sha256: &str) -> Option<(&str, Role)> {
        self.tokens
            .iter()
            .find(|(_, t)| t.sha256 == sha256)
            .map(|(n, t)| (n.as_str(), t.role))
    }
}
