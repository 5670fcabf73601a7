//! Who may use which route of the daemon's HTTP server.
//!
//! * `/healthz` and `/readyz` are open: probes (systemd, a load balancer)
//!   carry no credentials, and they say only whether the agent runs.
//! * `POST /hooks/git` is checked by the webhook secret (its own module).
//! * `/`, `/v1/status[/NAME]` and `/metrics` (the reports: resource
//!   names, drift, override reasons, error messages) need `Authorization:
//!   Bearer <token>` when `[server] token_file` is set.
//! * `POST /v1/reconcile` (work on demand) needs the bearer token when one
//!   is set, and beyond loopback always: the token, else the webhook
//!   secret (which a listener beyond loopback must have).
//!
//! Tokens are compared in constant time.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;

/// The credentials the server checks (replaced at a reload).
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// `[server] token_file`'s token.
    token: Option<Vec<u8>>,
    /// `[server] webhook_secret_file`'s secret.
    webhook: Option<Vec<u8>>,
    /// `[server] listen` is not a loopback address.
    beyond_loopback: bool,
}

/// Why a request was refused (the body of the 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal(pub &'static str);

impl Access {
    pub(crate) fn new(
        listen: SocketAddr,
        token: Option<Vec<u8>>,
        webhook: Option<Vec<u8>>,
    ) -> Self {
        Access {
            token,
            webhook,
            beyond_loopback: !listen.ip().is_loopback(),
        }
    }

    /// The webhook secret, for `POST /hooks/git`.
    pub(crate) fn webhook_secret(&self) -> Option<&[u8]> {
        self.webhook.as_deref()
    }

    /// The reports (`/`, `/v1/status`, `/metrics`): open unless a token is
    /// set.
    pub(crate) fn check_read(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        match &self.token {
            None => Ok(()),
            Some(token) => bearer_matches(headers, token).then_some(()).ok_or(Refusal(
                "this route needs `Authorization: Bearer <token>`, the token of [server] token_file",
            )),
        }
    }

    /// `POST /v1/reconcile`: the token when one is set; beyond loopback,
    /// the token or else the webhook secret; on loopback without a token,
    /// open (only this host reaches it).
    pub(crate) fn check_trigger(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        match (&self.token, &self.webhook, self.beyond_loopback) {
            (Some(token), _, _) => bearer_matches(headers, token).then_some(()).ok_or(Refusal(
                "POST /v1/reconcile needs `Authorization: Bearer <token>`, the token of [server] token_file",
            )),
            (None, Some(secret), true) => bearer_matches(headers, secret).then_some(()).ok_or(
                Refusal(
                    "POST /v1/reconcile beyond loopback needs `Authorization: Bearer <secret>`, the webhook secret (or set [server] token_file and send its token)",
                ),
            ),
            (None, None, true) => Err(Refusal(
                "POST /v1/reconcile beyond loopback needs a credential: set [server] token_file",
            )),
            (None, _, false) => Ok(()),
        }
    }

    /// What the reports are open to, for a warning at start: `None` when
    /// only this host reaches them or a token guards them.
    pub(crate) fn open_reports_warning(&self, listen: SocketAddr) -> Option<String> {
        (self.beyond_loopback && self.token.is_none()).then(|| {
            format!(
                "[server] listen = \"{listen}\" is beyond loopback and no [server] token_file is set: `/`, `/v1/status` and `/metrics` (resource names, drift, override reasons, errors) are served to anyone who reaches it; set token_file to require a bearer token"
            )
        })
    }
}

/// `Authorization: Bearer <expected>`, compared in constant time.
fn bearer_matches(headers: &HeaderMap, expected: &[u8]) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
    else {
        return false;
    };
    let given = given.trim().as_bytes();
    given.len() == expected.len() && bool::from(given.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn beyond_loopback_a_reconcile_needs_the_token_or_the_webhook_secret() {
        let wide: SocketAddr = "0.0.0.0:9477".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9477".parse().unwrap();
        let secret = Some(b"hook-secret".to_vec());
        let token = Some(b"read-token".to_vec());

        let open = Access::new(local, None, None);
        assert!(open.check_trigger(&with(None)).is_ok());
        assert!(open.check_read(&with(None)).is_ok());
        assert_eq!(open.open_reports_warning(local), None);

        let wide_hook = Access::new(wide, None, secret.clone());
        assert!(wide_hook.check_trigger(&with(None)).is_err());
        assert!(
            wide_hook
                .check_trigger(&with(Some("Bearer wrong")))
                .is_err()
        );
        assert!(
            wide_hook
                .check_trigger(&with(Some("Bearer hook-secret")))
                .is_ok()
        );
        assert!(
            wide_hook.check_read(&with(None)).is_ok(),
            "offered, not forced"
        );
        assert!(
            wide_hook
                .open_reports_warning(wide)
                .unwrap()
                .contains("token_file")
        );
        assert!(
            Access::new(wide, None, None)
                .check_trigger(&with(Some("Bearer ")))
                .is_err()
        );

        let guarded = Access::new(local, token, secret);
        for check in [Access::check_read, Access::check_trigger] {
            assert!(check(&guarded, &with(None)).is_err());
            assert!(check(&guarded, &with(Some("Bearer hook-secret"))).is_err());
            assert!(check(&guarded, &with(Some("Basic read-token"))).is_err());
            assert!(check(&guarded, &with(Some("Bearer read-token"))).is_ok());
        }
    }
}
