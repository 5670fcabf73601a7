//! Verifying Git hosting webhooks: GitHub (`X-Hub-Signature-256:
//! sha256=<hex HMAC-SHA256 of the body>`), Gitea (`X-Gitea-Signature: <hex
//! HMAC-SHA256>`) and GitLab (`X-Gitlab-Token: <the secret>`).
//!
//! # Guarantees
//! * Every comparison with the secret is constant-time (`Mac::verify_slice`,
//!   `subtle`): timing tells an attacker nothing about the secret.
//! * A request without any of the three headers, or with a wrong one, is
//!   refused; nothing it says is believed.

use axum::http::HeaderMap;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Why a webhook was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// None of the three signature headers.
    Unsigned,
    /// A signature or token that does not match the secret.
    BadSignature,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unsigned => {
                "no X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token header"
            }
            Refusal::BadSignature => "the signature does not match the webhook secret",
        }
    }
}

/// Checks a webhook; the sender's format when it is authentic.
pub fn verify(headers: &HeaderMap, body: &[u8], secret: &[u8]) -> Result<&'static str, Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(signature) = header("x-hub-signature-256") {
        let hex = signature
            .strip_prefix("sha256=")
            .ok_or(Refusal::BadSignature)?;
        return hmac_matches(secret, body, hex)
            .then_some("github")
            .ok_or(Refusal::BadSignature);
    }
    if let Some(signature) = header("x-gitea-signature") {
        return hmac_matches(secret, body, signature)
            .then_some("gitea")
            .ok_or(Refusal::BadSignature);
    }
    if let Some(token) = header("x-gitlab-token") {
        let equal: bool = token.as_bytes().ct_eq(secret).into();
        return equal.then_some("gitlab").ok_or(Refusal::BadSignature);
    }
    Err(Refusal::Unsigned)
}

fn hmac_matches(secret: &[u8], body: &[u8], hex: &str) -> bool {
    let Some(expected) = decode_hex(hex.trim()) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The hex HMAC-SHA256 of `body` under `secret` (what GitHub and Gitea
/// send; tests sign with it).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    crate::model::hash::hex(&mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn each_format_is_verified_and_forgeries_are_refused() {
        let (secret, body) = (
            b"s3cret".as_slice(),
            b"{\"ref\":\"refs/heads/main\"}".as_slice(),
        );
        let good = sign(secret, body);
        assert_eq!(
            verify(
                &headers("x-hub-signature-256", &format!("sha256={good}")),
                body,
                secret
            ),
            Ok("github")
        );
        assert_eq!(
            verify(&headers("x-gitea-signature", &good), body, secret),
            Ok("gitea")
        );
        assert_eq!(
            verify(&headers("x-gitlab-token", "s3cret"), body, secret),
            Ok("gitlab")
        );
        let forged = sign(b"other", body);
        for h in [
            headers("x-hub-signature-256", &format!("sha256={forged}")),
            headers("x-hub-signature-256", &good),
            headers("x-gitea-signature", &forged),
            headers("x-gitea-signature", "zz"),
            headers("x-gitlab-token", "s3cre"),
        ] {
            assert_eq!(
                verify(&h, body, secret),
                Err(Refusal::BadSignature),
                "{h:?}"
            );
        }
        assert_eq!(
            verify(&HeaderMap::new(), body, secret),
            Err(Refusal::Unsigned)
        );
        assert_eq!(
            verify(&headers("x-gitea-signature", &good), b"tampered", secret),
            Err(Refusal::BadSignature)
        );
    }
}
