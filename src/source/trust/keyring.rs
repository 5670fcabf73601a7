//! An armored OpenPGP keyring (`gpg --export --armor`) and the check of
//! one detached OpenPGP signature (what `git commit -S` with gpg writes)
//! against it.
//!
//! A key is accepted into the keyring only when its self-signatures
//! verify; a revoked key, or a signature by a key that is not in the
//! keyring, refuses the commit.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::types::KeyDetails;

use super::{Refused, TrustError};

/// The keys allowed to sign, read once (a reload of the configuration
/// reads the file again).
#[derive(Debug, Clone)]
pub struct Keyring {
    file: PathBuf,
    keys: Vec<SignedPublicKey>,
}

impl Keyring {
    pub fn load(file: &Path) -> Result<Self, TrustError> {
        Self::parse(&super::read_file(file)?, file)
    }

    pub fn parse(text: &str, file: &Path) -> Result<Self, TrustError> {
        let invalid = |message: String| TrustError::Invalid {
            file: file.to_path_buf(),
            line: 0,
            message,
        };
        let (keys, _) = SignedPublicKey::from_string_many(text).map_err(|e| {
            invalid(format!(
                "not an armored OpenPGP public keyring ({e}); export one with gpg --export --armor"
            ))
        })?;
        let mut loaded = Vec::new();
        for key in keys {
            let key = key.map_err(|e| invalid(format!("a key cannot be read ({e})")))?;
            key.verify_bindings().map_err(|e| {
                invalid(format!(
                    "the self-signatures of key {} do not verify ({e})",
                    hex(&key.fingerprint())
                ))
            })?;
            loaded.push(key);
        }
        if loaded.is_empty() {
            return Err(TrustError::Empty {
                file: file.to_path_buf(),
                what: "OpenPGP public keys",
            });
        }
        Ok(Keyring {
            file: file.to_path_buf(),
            keys: loaded,
        })
    }

    /// Checks `armored` (a commit's `gpgsig` header) over `data` (the
    /// commit without it): the signer's description, or why not.
    pub fn verify(&self, armored: &str, data: &[u8], now: SystemTime) -> Result<String, Refused> {
        if armored.contains("BEGIN SSH SIGNATURE") {
            return Err(Refused::new(
                "an SSH key",
                "the commit is signed with an SSH key, and verify = \"gpg\"",
            ));
        }
        let (signature, _) = DetachedSignature::from_string(armored).map_err(|e| {
            Refused::new(
                "an unreadable signature",
                format!("the signature is not an OpenPGP signature tend can read ({e})"),
            )
        })?;
        let issuers: Vec<String> = signature
            .signature
            .issuer_fingerprint()
            .iter()
            .map(hex)
            .chain(signature.signature.issuer_key_id().iter().map(hex))
            .collect();
        let issued_by = |fingerprint: &pgp::types::Fingerprint, key_id: &pgp::types::KeyId| {
            let (fingerprint, key_id) = (hex(fingerprint), hex(key_id));
            issuers.iter().any(|i| *i == fingerprint || *i == key_id)
        };
        for key in &self.keys {
            let named = format!("OpenPGP key {}{}", hex(&key.fingerprint()), user_id(key));
            let primary = issued_by(&key.fingerprint(), &key.legacy_key_id());
            let subkey = key
                .public_subkeys
                .iter()
                .find(|s| issued_by(&s.key.fingerprint(), &s.key.legacy_key_id()));
            if !primary && subkey.is_none() {
                continue;
            }
            if !key.details.revocation_signatures.is_empty() {
                return Err(Refused::new(named, "the key is revoked"));
            }
            let primary_expiry = expires_at(
                key.primary_key.created_at(),
                key.details.users.iter().flat_map(|u| &u.signatures),
            );
            let subkey_expiry = subkey
                .filter(|_| !primary)
                .and_then(|s| expires_at(s.key.created_at(), &s.signatures));
            if let Some(expired) = [primary_expiry, subkey_expiry]
                .into_iter()
                .flatten()
                .filter(|at| *at <= now)
                .min()
            {
                return Err(Refused::timed(
                    named,
                    format!("the key expired at {}", crate::time::rfc3339(expired)),
                ));
            }
            let verified = match subkey {
                Some(sub) if !primary => signature.verify(&sub.key, data),
                _ => signature.verify(&key.primary_key, data),
            };
            return match verified {
                Ok(()) => Ok(named),
                Err(_) => Err(Refused::new(
                    named,
                    "the signature does not match the commit's content (altered after signing?)",
                )),
            };
        }
        let who = issuers
            .first()
            .map_or("an OpenPGP key with no issuer".to_string(), |i| {
                format!("OpenPGP key {i}")
            });
        Err(Refused::new(
            who,
            format!("the key is not in {}", self.file.display()),
        ))
    }
}

/// When a key made at `created` expires, by its newest self-signature
/// that says (a later self-signature may extend or remove the expiry; a
/// zero expiry means none).
fn expires_at<'a>(
    created: pgp::types::Timestamp,
    signatures: impl IntoIterator<Item = &'a pgp::packet::Signature>,
) -> Option<SystemTime> {
    let newest = signatures
        .into_iter()
        .max_by_key(|s| s.created().map(|t| t.as_secs()))?;
    let lifetime = std::time::Duration::from(newest.key_expiration_time()?);
    (!lifetime.is_zero()).then(|| SystemTime::from(created) + lifetime)
}

/// ` (First Last <mail>)`: the key's first user id, for messages.
fn user_id(key: &SignedPublicKey) -> String {
    key.details
        .users
        .first()
        .map(|u| format!(" ({})", String::from_utf8_lossy(u.id.id())))
        .unwrap_or_default()
}

fn hex(bytes: &impl AsRef<[u8]>) -> String {
    bytes.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}
