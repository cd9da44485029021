//! The admin API's answer to a request axum itself cannot take apart (a body that
//! is not JSON or not of the route's shape, a missing `Content-Type: application/json`,
//! a path or query of the wrong type): axum refuses those before a handler runs,
//! in plain text. [`json_refusals`] turns them into the API's one error shape,
//! `{"error": "invalid", "message": ...}`, keeping axum's status (400, 415, 422),
//! so that a client reads every refusal the same way.
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api;

/// Most of a refusal's text read (axum's are one line).
const MAX_TEXT: usize = 16 * 1024;

/// Characters of axum's text kept in the message: it quotes the request (serde
/// names the value it could not take), which may be long.
const MAX_MESSAGE_CHARS: usize = 300;

/// The middleware: a client error (4xx) answered with anything but JSON is
/// answered again as the API's JSON error; everything else passes unchanged.
pub(crate) async fn json_refusals(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let json = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !status.is_client_error() || json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), MAX_TEXT).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    };
    let (error, message) = refusal(status, &text);
    (status, Json(api::ApiError { error, message })).into_response()
}

/// The kind and message of a plain-text refusal with `status` and `text`.
fn refusal(status: StatusCode, text: &str) -> (String, String) {
    let kind = match status {
        StatusCode::NOT_FOUND => drove_types::ErrorKind::NotFound,
        _ => drove_types::ErrorKind::Invalid,
    };
    let text = text.trim();
    let message = if text.is_empty() {
        format!(
            "Bad request: {}",
            status.canonical_reason().unwrap_or("refused")
        )
    } else {
        let mut m: String = text
            .chars()
            .take(MAX_MESSAGE_CHARS)
            .flat_map(|c| match c.is_control() {
                true => c.escape_unicode().collect::<Vec<_>>(),
                false => vec![c],
            })
            .collect();
        if text.chars().nth(MAX_MESSAGE_CHARS).is_some() {
            m.push('…');
        }
        format!("Bad request: {m}")
    };
    (kind.as_str().to_string(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_plain_text_refusal_becomes_the_json_error() {
        let (kind, msg) = refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Failed to deserialize the JSON body into the target type: name: invalid type",
        );
        assert_eq!(kind, "invalid");
        assert_eq!(
            msg,
            "Bad request: Failed to deserialize the JSON body into the target type: name: \
             invalid type"
        );
        let (kind, msg) = refusal(StatusCode::METHOD_NOT_ALLOWED, "");
        assert_eq!(
            (kind.as_str(), msg.as_str()),
            ("invalid", "Bad request: Method Not Allowed")
        );
        assert_eq!(refusal(StatusCode::NOT_FOUND, "").0, "not_found");
        let (_, msg) = refusal(
            StatusCode::BAD_REQUEST,
            &format!("a\u{1b}{}", "x".repeat(500)),
        );
        assert!(msg.contains("a\\u{1b}x") && msg.ends_with('…'), "{msg}");
        assert!(msg.chars().count() < 400, "{msg}");
    }
}
