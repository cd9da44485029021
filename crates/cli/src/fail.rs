//! Errors the CLI finds itself (a bad option, a name not in the list it fetched,
//! a cluster it cannot reach), with the kind a node would give them, so that
//! `--json` says `invalid`, `not_found` or `unavailable` as for a node's refusal
//! rather than a bare `error`. They are [`drove_types::Error`]s inside the
//! `anyhow` chain; [`kind`] finds the kind of any error the CLI prints.
use drove_types::{Error, ErrorKind};

/// The request is wrong (a bad option or value).
pub fn invalid(msg: impl Into<String>) -> anyhow::Error {
    Error::invalid(msg).into()
}

/// What was named does not exist.
pub fn not_found(msg: impl Into<String>) -> anyhow::Error {
    Error::not_found(msg).into()
}

/// The cluster could not be reached.
pub fn unavailable(msg: impl Into<String>) -> anyhow::Error {
    Error::unavailable(msg).into()
}

/// The kind `--json` prints for `e`: `outcome_unknown` when the outcome is not
/// known, the node's kind when a node refused, the kind of a [`drove_types::Error`]
/// in the chain (the CLI's own, or a parse of a size or policy), else `error`.
pub fn kind(e: &anyhow::Error) -> String {
    if e.chain()
        .any(|c| c.downcast_ref::<crate::client::OutcomeUnknown>().is_some())
    {
        return ErrorKind::OutcomeUnknown.as_str().to_string();
    }
    if let Some(r) = e
        .chain()
        .find_map(|c| c.downcast_ref::<crate::client::Refused>())
    {
        return r.kind.clone();
    }
    match e.chain().find_map(|c| c.downcast_ref::<Error>()) {
        Some(d) => d.kind().as_str().to_string(),
        None => "error".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn test_the_kind_is_found_under_context_and_defaults_to_error() {
        assert_eq!(kind(&not_found("No VDI named 'x'")), "not_found");
        let parsed: anyhow::Result<u64> = drove_types::parse_size("12Q").map_err(Into::into);
        let e = parsed.context("Bad --size").unwrap_err();
        assert_eq!(kind(&e), "invalid");
        assert_eq!(kind(&anyhow::anyhow!("something")), "error");
        let refused: anyhow::Error = crate::client::Refused {
            kind: "locked".into(),
            message: "m".into(),
        }
        .into();
        assert_eq!(kind(&refused), "locked");
    }
}
