//! Every status code an HTTP provider may answer, as the executor's
//! provider error kinds.

use std::time::Duration;

use reqwest::StatusCode;

use super::super::ProviderError;
use super::wire::Problem;

/// The delay a 429 or 503 asks for when it names none.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The error for a non-success `status` about `resource`.
pub(crate) fn classify(
    resource: &str,
    status: StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
) -> ProviderError {
    let resource = resource.to_string();
    let message = format!("{status}: {}", problem_text(body));
    match status.as_u16() {
        404 => ProviderError::NotFound { resource },
        409 | 412 => ProviderError::Conflict { resource, message },
        429 => ProviderError::RateLimited {
            resource,
            retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
        },
        503 if retry_after.is_some() => ProviderError::RateLimited {
            resource,
            retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
        },
        // A timeout at a proxy in front of the server, and every 5xx.
        408 | 500..=599 => ProviderError::Retryable { resource, message },
        401 | 403 => ProviderError::Permanent {
            resource,
            message: format!("{message} (check the provider's token_file)"),
        },
        _ => ProviderError::Permanent { resource, message },
    }
}

/// `Retry-After` in seconds, or as an HTTP date (the delay until then,
/// zero when it has passed: `now` is the time the answer arrived).
pub(super) fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => crate::time::parse_http_date(value).map(|at| crate::time::since(at, now)),
    }
}

/// A problem document's title and detail, or the body's first bytes.
pub(super) fn problem_text(body: &[u8]) -> String {
    match serde_json::from_slice::<Problem>(body) {
        Ok(p) => match p.detail {
            Some(detail) => format!("{}: {detail}", p.title),
            None => p.title,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                "no body".into()
            } else {
                text.chars().take(200).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(status: u16, retry: Option<u64>) -> ProviderError {
        classify(
            "orders",
            StatusCode::from_u16(status).unwrap(),
            retry.map(Duration::from_secs),
            br#"{"type":"about:blank","title":"T","status":0,"detail":"D"}"#,
        )
    }

    #[test]
    fn every_status_code_has_a_kind() {
        assert!(matches!(kind(404, None), ProviderError::NotFound { .. }));
        assert!(matches!(kind(409, None), ProviderError::Conflict { .. }));
        assert!(matches!(kind(412, None), ProviderError::Conflict { .. }));
        assert_eq!(
            kind(429, Some(7)),
            ProviderError::RateLimited {
                resource: "orders".into(),
                retry_after: Duration::from_secs(7)
            }
        );
        assert!(matches!(
            kind(429, None),
            ProviderError::RateLimited { retry_after, .. } if retry_after == DEFAULT_RETRY_AFTER
        ));
        assert!(matches!(
            kind(503, Some(2)),
            ProviderError::RateLimited { .. }
        ));
        for status in [408, 500, 502, 503, 504] {
            assert!(kind(status, None).is_transient(), "{status}");
        }
        for status in [400, 401, 403, 405, 410, 422, 428] {
            assert!(
                matches!(kind(status, None), ProviderError::Permanent { .. }),
                "{status}"
            );
        }
        // The server's problem as it is (it said an Idempotency-Key was
        // reused even when a field was refused).
        let e = kind(422, None).to_string();
        assert!(e.contains("T: D") && !e.contains("Idempotency-Key"), "{e}");
    }

    #[test]
    fn retry_after_is_read_in_seconds_or_as_an_http_date() {
        let now = crate::time::parse_rfc3339("2015-10-21T07:27:30Z").unwrap();
        assert_eq!(retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date passed: at once"
        );
        assert_eq!(retry_after("soon", now), None);
    }
}
