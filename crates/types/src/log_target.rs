//! The log target of lines anyone who reaches a port can cause once per connection
//! (an NBD connection over TCP that ended in an error: a handshake timeout, garbage,
//! a failed TLS handshake). A flood of connections makes one such line each, so the
//! node's log limit (`drove node run`'s rate limit per callsite) limits lines of this
//! target whatever their level, as it does warnings; other info lines pass whole
//! (those of the unix socket too: its clients are the local ones its mode admits).

/// The target of per-connection log lines: `tracing::info!(target: CONNECTION_LOG, ...)`.
pub const CONNECTION_LOG: &str = "drove::connection";
