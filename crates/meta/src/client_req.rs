//! Exactly-once commands for clients outside the cluster (the CLI): a request that
//! carries a client request id ([`ClientRequestId`], the admin API's
//! `Drove-Request-Id` header) runs with it in scope ([`with_client_request`]), and
//! each [`crate::Meta::execute`] under it proposes with a request id derived from it
//! (the first command of the request gets `seq`, the next `seq + 1`, ...). The state
//! machine remembers the results of recent request ids, so the same request sent
//! again after an answer was lost gets the first result instead of acting twice.
//!
//! Client ids have their top bit set and node-made ones have it clear, so no client
//! can choose an id that a node will use later and suppress that node's command.
use crate::types::RequestId;
use std::cell::Cell;
use std::future::Future;

/// The top bit of `RequestId::client`: set for ids chosen by clients.
pub const EXTERNAL_CLIENT: u64 = 1 << 63;

/// The id a client gave its request: 32 hex digits, `client` then `seq`, as the
/// `Drove-Request-Id` header carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientRequestId {
    /// Chosen at random by the client, once per command it runs.
    pub client: u64,
    /// The first sequence number of the request.
    pub seq: u64,
}

impl ClientRequestId {
    /// Parse 32 hex digits; anything else is refused with the reason.
    pub fn parse(s: &str) -> Result<ClientRequestId, String> {
        let s = s.trim();
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a request id is 32 hexadecimal digits, not '{}'",
                s.chars().take(40).collect::<String>()
            ));
        }
        let client = u64::from_str_radix(&s[..16], 16).map_err(|e| e.to_string())?;
        let seq = u64::from_str_radix(&s[16..], 16).map_err(|e| e.to_string())?;
        Ok(ClientRequestId { client, seq })
    }
}

impl std::fmt::Display for ClientRequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{:016x}", self.client, self.seq)
    }
}

struct Scope {
    id: ClientRequestId,
    used: Cell<u64>,
}

tokio::task_local! {
    static SCOPE: Scope;
}

/// Run `f` (one admin request) with `id` in scope: its metadata commands get request
/// ids derived from `id`, in the order it executes them.
pub async fn with_client_request<F: Future>(id: ClientRequestId, f: F) -> F::Output {
    SCOPE
        .scope(
            Scope {
                id,
                used: Cell::new(0),
            },
            f,
        )
        .await
}

/// Whether this task serves a request with a client request id.
pub fn in_client_request() -> bool {
    SCOPE.try_with(|_| ()).is_ok()
}

/// The request id of the next command executed under a client request, if any.
pub(crate) fn next() -> Option<RequestId> {
    SCOPE
        .try_with(|s| {
            let k = s.used.get();
            s.used.set(k + 1);
            RequestId {
                client: s.id.client | EXTERNAL_CLIENT,
                seq: s.id.seq.wrapping_add(k),
            }
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_and_print_round_trip_and_bad_ids_are_refused() {
        let id = ClientRequestId::parse("00000000000000ff0000000000000010").unwrap();
        assert_eq!(
            id,
            ClientRequestId {
                client: 255,
                seq: 16
            }
        );
        assert_eq!(id.to_string(), "00000000000000ff0000000000000010");
        for bad in ["", "xyz", "00ff", &"0".repeat(33), &"g".repeat(32)] {
            assert!(ClientRequestId::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn test_commands_in_a_client_request_get_ids_in_order_with_the_top_bit() {
        assert_eq!(next(), None);
        let id = ClientRequestId { client: 7, seq: 40 };
        let ids = with_client_request(id, async { [next(), next()] }).await;
        let want = |seq| {
            Some(RequestId {
                client: 7 | EXTERNAL_CLIENT,
                seq,
            })
        };
        assert_eq!(ids, [want(40), want(41)]);
        assert_eq!(next(), None);
    }
}
