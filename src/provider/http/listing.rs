//! Listing every database, page by page (`GET /v1/databases`).
//!
//! # Guarantees
//! * Each page's databases are read (and their ETags remembered, the
//!   database tend is not asked about included) on the blocking pool while
//!   the next page is asked for: only the page's outline (how many it holds, the
//!   next token) is read before the next request goes out, so reading a
//!   page overlaps the server's work on the next one instead of adding to
//!   it.
//! * A listing that would never end, or would list a database twice, is
//!   an error (a page token seen again, [`MAX_EMPTY_PAGES`] empty pages in
//!   a row, a name twice); so is one that takes longer than
//!   [`LISTING_TIMEOUTS`] × `timeout` as a whole.

use std::collections::HashSet;
use std::fmt;
use std::time::SystemTime;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::Value;

use super::wire::{Database, DatabasePage};
use super::{HttpProvider, LISTING_TIMEOUTS, MAX_EMPTY_PAGES, Seen, segment};
use crate::provider::{Observation, ProviderError, ResourceStatus};

/// One database as listed: its observation, the ETag to remember, and the
/// `observedAt` text when it was not a time.
pub(super) struct Listed {
    pub observation: Observation,
    pub etag: String,
    pub unreadable_time: Option<String>,
}

impl Listed {
    /// A database as the contract describes it. A status the contract does
    /// not define is an error (not `ready`); an `observedAt` that is not
    /// RFC 3339 makes the observation as old as can be (stale: never used
    /// to decide a write after one of tend's), never "now". Pure: runs on
    /// the blocking pool.
    pub(super) fn of(endpoint: &str, mut db: Database) -> Result<Listed, ProviderError> {
        let status = match db.status.as_str() {
            "provisioning" => ResourceStatus::Provisioning,
            "ready" => ResourceStatus::Ready,
            "deleting" => ResourceStatus::Deleting,
            other => {
                return Err(ProviderError::Permanent {
                    resource: db.name.clone(),
                    message: format!(
                        "{endpoint}: database `{}` has status {:?}, which the contract does not define (provisioning, ready or deleting)",
                        crate::escape::terminal(&db.name),
                        crate::escape::terminal(other)
                    ),
                });
            }
        };
        let (observed_at, unreadable_time) = match crate::time::parse_rfc3339(&db.observed_at) {
            Some(at) => (at, None),
            None => (SystemTime::UNIX_EPOCH, Some(db.observed_at)),
        };
        // The name a database is listed under is its databaseName, whether
        // or not the server echoes the field (one it did not create
        // itself does not): adoption compares the declared name with it.
        if !db.fields.contains_key("databaseName") {
            db.fields
                .insert("databaseName".to_string(), Value::String(db.name.clone()));
        }
        Ok(Listed {
            observation: Observation {
                database_name: db.name,
                external_id: db.id,
                status,
                fields: db.fields,
                labels: db.labels,
                observed_at,
                unobserved: Vec::new(),
            },
            etag: db.etag,
            unreadable_time,
        })
    }
}

/// What a page says before its databases are read: how many it holds and
/// the next page's token.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageOutline {
    items: Counted,
    #[serde(default)]
    next_page_token: Option<String>,
}

/// The length of a JSON array, its elements skipped.
struct Counted(usize);

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = usize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(n)
            }
        }
        deserializer.deserialize_seq(Count).map(Counted)
    }
}

/// A page's databases, read whole and remembered (on the blocking pool).
fn read_page(
    endpoint: &str,
    seen: &Seen,
    status: StatusCode,
    body: &[u8],
) -> Result<Vec<Observation>, ProviderError> {
    let page: DatabasePage =
        serde_json::from_slice(body).map_err(|e| broken_body(endpoint, "*", status, &e))?;
    page.items
        .into_iter()
        .map(|db| Listed::of(endpoint, db).map(|listed| seen.remember(endpoint, listed)))
        .collect()
}

/// An answer whose body is not what the contract says it is.
pub(super) fn broken_body(
    endpoint: &str,
    resource: &str,
    status: StatusCode,
    e: &serde_json::Error,
) -> ProviderError {
    ProviderError::Permanent {
        resource: resource.to_string(),
        message: format!("{endpoint} answered {status} with a body that breaks the contract: {e}"),
    }
}

impl HttpProvider {
    /// Every database the token can see. Listing costs the same whatever
    /// names a cycle wants (the contract has no filter by name), so a
    /// cycle starts this before it has read its inputs (see
    /// `reconcile::observe::ListingAhead`).
    pub async fn observe_everything(&self) -> Result<Vec<Observation>, ProviderError> {
        self.server_capabilities().await?;
        self.list(|_| true).await
    }

    /// The databases `keep` keeps, within [`LISTING_TIMEOUTS`] × `timeout`
    /// as a whole.
    pub(super) async fn list(
        &self,
        keep: impl Fn(&Observation) -> bool,
    ) -> Result<Vec<Observation>, ProviderError> {
        let limit = self.settings.timeout * LISTING_TIMEOUTS;
        match tokio::time::timeout(limit, self.list_pages()).await {
            Ok(listed) => Ok(listed?.into_iter().filter(|o| keep(o)).collect()),
            Err(_) => Err(ProviderError::Retryable {
                resource: "*".into(),
                message: format!(
                    "{}: the listing did not end within {} ({LISTING_TIMEOUTS} × timeout)",
                    self.settings.endpoint,
                    crate::time::duration(limit)
                ),
            }),
        }
    }

    /// Every page, one request each: a page's outline is read before the
    /// next request, its databases on the blocking pool meanwhile; the
    /// page before is taken in (its names checked) once the next one has
    /// arrived, so a server that lists the same databases under fresh
    /// tokens for ever is stopped at the first name seen twice.
    async fn list_pages(&self) -> Result<Vec<Observation>, ProviderError> {
        let endpoint = &self.settings.endpoint;
        let mut listed = Vec::new();
        let mut names: HashSet<String> = HashSet::new();
        let mut reading: Option<tokio::task::JoinHandle<Result<Vec<Observation>, ProviderError>>> =
            None;
        let mut token: Option<String> = None;
        let mut tokens_seen: HashSet<String> = HashSet::new();
        let mut empty_pages = 0usize;
        let broken = |why: String| ProviderError::Permanent {
            resource: "*".into(),
            message: format!(
                "{endpoint} {why}: the listing would never end, or would list a database twice"
            ),
        };
        // Takes a page's databases in: each name once in the whole listing.
        let mut take_in = async |page: tokio::task::JoinHandle<_>,
                                 listed: &mut Vec<Observation>|
               -> Result<(), ProviderError> {
            let page: Vec<Observation> = page.await.map_err(|e| ProviderError::Permanent {
                resource: "*".into(),
                message: format!("{endpoint}: reading a page of the listing stopped: {e}"),
            })??;
            for o in &page {
                if !names.insert(o.database_name.clone()) {
                    return Err(broken(format!("listed `{}` twice", o.database_name)));
                }
            }
            listed.extend(page);
            Ok(())
        };
        loop {
            // The contract's largest page: the server answers with its own
            // limit if lower.
            let path = match &token {
                Some(t) => format!("/databases?pageSize=1000&pageToken={}", segment(t)),
                None => "/databases?pageSize=1000".to_string(),
            };
            let answer = self.send(Method::GET, &path, "*", &[], None).await?;
            let outline: PageOutline = self.parse("*", &answer)?;
            let (status, body, at) = (answer.status, answer.body, endpoint.clone());
            let seen = self.seen.clone();
            let this = tokio::task::spawn_blocking(move || read_page(&at, &seen, status, &body));
            if let Some(before) = reading.replace(this) {
                take_in(before, &mut listed).await?;
            }
            empty_pages = if outline.items.0 == 0 {
                empty_pages + 1
            } else {
                0
            };
            match outline.next_page_token {
                // `""` ends a listing as `null` does.
                None => break,
                Some(next) if next.is_empty() => break,
                Some(next) => {
                    if !tokens_seen.insert(next.clone()) {
                        return Err(broken(format!(
                            "returned page token {next:?} again (after {} pages)",
                            tokens_seen.len()
                        )));
                    }
                    if empty_pages >= MAX_EMPTY_PAGES {
                        return Err(broken(format!(
                            "returned {empty_pages} empty pages in a row, each with a next page token"
                        )));
                    }
                    token = Some(next);
                }
            }
        }
        if let Some(last) = reading {
            take_in(last, &mut listed).await?;
        }
        Ok(listed)
    }
}
