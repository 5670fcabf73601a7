//! The daemon's HTTP server (axum, on `[server] listen`): `/healthz`,
//! `/readyz`, `/metrics`, `/v1/status[/{name}]`, `POST /hooks/git`,
//! `POST /v1/reconcile`, and the latest report at `/`.
//!
//! # Guarantees
//! * A webhook triggers a fetch only when its signature (or token) matches
//!   the webhook secret; anything else is 401 and triggers nothing.
//! * The reports and `POST /v1/reconcile` need the credentials
//!   [`access`] says (a bearer token when `[server] token_file` is set;
//!   beyond loopback a reconcile always needs one), and reconciles asked
//!   for are coalesced to one start per `reconcile_min_interval`
//!   ([`coalesce`]).
//! * Request bodies are capped at 1 MiB and must arrive within 10 s.
//! * No response carries a secret: the reports never hold one, and errors
//!   name what failed, not the credential.

pub(crate) mod access;
pub(crate) mod coalesce;
pub(crate) mod listener;
pub(crate) mod webhook;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::watch;

pub(crate) use crate::telemetry::Metrics;

use crate::source::Trigger;
use crate::status::board::StatusBoard;

/// The largest request body read.
pub(crate) const MAX_BODY: usize = 1024 * 1024;
/// How long a request body may take to arrive.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server reads and the wake-ups it can cause.
pub(crate) struct ServerState {
    pub board: Arc<StatusBoard>,
    pub metrics: Arc<Metrics>,
    /// Fires a fetch of the source now (replaced at a reload).
    pub fetch: Mutex<Option<Trigger>>,
    /// Bumped to make every provider worker reconcile now.
    pub resync: watch::Sender<u64>,
    /// The credentials routes need (replaced at a reload).
    pub access: Mutex<access::Access>,
    /// The gate in front of `POST /v1/reconcile`.
    pub reconciles: coalesce::Coalescer,
    /// Every provider has reported at least once.
    pub ready: watch::Receiver<bool>,
    /// While this agent stands by for its group's leader lease: the line
    /// naming the leader (`/readyz` says so, with 200: a standby is ready).
    pub standby: watch::Receiver<Option<String>>,
}

impl ServerState {
    fn access(&self) -> access::Access {
        self.access
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A fetch of the source and a reconcile of every resource, now.
    fn reconcile_everything(&self) {
        self.fire_fetch();
        self.resync.send_modify(|n| *n += 1);
    }

    /// Fetches the source now.
    pub(crate) fn fire_fetch(&self) {
        if let Some(trigger) = self
            .fetch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            trigger.fire();
        }
    }
}

/// The routes.
pub(crate) fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/status/{name}", get(status_of))
        .route("/v1/reconcile", post(reconcile_now))
        .route("/hooks/git", post(git_hook))
        .with_state(state)
}

/// Serves until `shutdown` turns true, at most `max_connections` at once
/// (see [`listener`]).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    shutdown: tokio_util::sync::CancellationToken,
    max_connections: usize,
) -> std::io::Result<()> {
    let listener = listener::BoundedListener::new(listener, max_connections);
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec_pretty(value) {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode: {e}\n"),
        ),
    }
}

fn not_yet() -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "no cycle has finished yet\n",
    )
}

fn refused(refusal: access::Refusal) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::WWW_AUTHENTICATE, "Bearer"),
        ],
        format!("{}\n", refusal.0),
    )
        .into_response()
}

/// The latest report as a page (`latest.html`'s content).
async fn index(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    if let Err(r) = state.access().check_read(&headers) {
        return refused(r);
    }
    match state.board.latest() {
        Some(report) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            crate::status::html::page(&report, crate::status::writer::TITLE),
        )
            .into_response(),
        None => not_yet(),
    }
}

async fn readyz(State(state): State<Arc<ServerState>>) -> Response {
    if let Some(line) = state.standby.borrow().as_ref() {
        return text(StatusCode::OK, format!("{line}\n"));
    }
    // A source that cannot be read is said, whatever else holds: it is
    // what keeps a new agent from starting and an old one on an old commit.
    let source = state.board.source().failure.map(|f| {
        format!(
            "the source cannot be read (since {}, {} attempt{}): {}",
            crate::time::rfc3339(f.since),
            f.failures,
            if f.failures == 1 { "" } else { "s" },
            f.error
        )
    });
    if *state.ready.borrow() {
        // Ready, and said plainly when it acts on nothing.
        let suspended = state
            .board
            .latest()
            .and_then(|report| crate::status::render::suspension_line(&report));
        let notes: Vec<String> = suspended.into_iter().chain(source).collect();
        match notes.is_empty() {
            true => text(StatusCode::OK, "ready\n"),
            false => text(StatusCode::OK, format!("ready; {}\n", notes.join("; "))),
        }
    } else {
        let why =
            source.unwrap_or_else(|| "waiting for the first snapshot and the first cycle".into());
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("starting: {why}\n"),
        )
    }
}

async fn metrics(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    if let Err(r) = state.access().check_read(&headers) {
        return refused(r);
    }
    // The fleet's gauges are counted from the merged report when scraped,
    // not at every worker's report.
    let fleet = state.board.latest().map(|report| report.fleet());
    let text = state.metrics.scrape(fleet.as_ref());
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn status(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    if let Err(r) = state.access().check_read(&headers) {
        return refused(r);
    }
    match state.board.latest() {
        Some(report) => json(report.as_ref()),
        None => not_yet(),
    }
}

async fn status_of(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(r) = state.access().check_read(&headers) {
        return refused(r);
    }
    let Some(report) = state.board.latest() else {
        return not_yet();
    };
    match report.resources.iter().find(|r| r.name == name) {
        Some(resource) => json(resource),
        None => text(
            StatusCode::NOT_FOUND,
            format!("no resource named `{}`\n", crate::escape::terminal(&name)),
        ),
    }
}

/// Reads a request body within the size and time limits.
async fn body(request: Request) -> Result<(HeaderMap, axum::body::Bytes), Response> {
    let (parts, body): (_, Body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => Ok((parts.headers, bytes)),
        Ok(Err(_)) => Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY} bytes\n"),
        )),
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            "the body did not arrive in time\n",
        )),
    }
}

async fn reconcile_now(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    if let Err(r) = state.access().check_trigger(request.headers()) {
        tracing::warn!("POST /v1/reconcile refused: {}", r.0);
        return refused(r);
    }
    if let Err(response) = body(request).await {
        return response;
    }
    let answer = match state.reconciles.admit(std::time::Instant::now()) {
        coalesce::Admitted::Now => {
            state.reconcile_everything();
            "a fetch and a reconcile of every resource are on their way\n".to_string()
        }
        coalesce::Admitted::Scheduled(wait) => {
            let later = state.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                later.reconciles.started(std::time::Instant::now());
                later.reconcile_everything();
            });
            format!(
                "a reconcile started less than [server] reconcile_min_interval ago: a fetch and a reconcile of every resource start in {} ms\n",
                wait.as_millis()
            )
        }
        coalesce::Admitted::Folded(wait) => format!(
            "folded into the reconcile that starts in {} ms (one start per [server] reconcile_min_interval)\n",
            wait.as_millis()
        ),
    };
    text(StatusCode::ACCEPTED, answer)
}

async fn git_hook(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    let (headers, bytes) = match body(request).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let access = state.access();
    let Some(secret) = access.webhook_secret() else {
        return text(
            StatusCode::UNAUTHORIZED,
            "webhooks are not accepted: [server] webhook_secret_file is not configured\n",
        );
    };
    match webhook::verify(&headers, &bytes, secret) {
        Ok(format) => {
            tracing::info!(format, "webhook accepted: fetching now");
            state.fire_fetch();
            text(StatusCode::ACCEPTED, "fetching\n")
        }
        Err(refusal) => {
            tracing::warn!("webhook refused: {}", refusal.as_str());
            text(StatusCode::UNAUTHORIZED, format!("{}\n", refusal.as_str()))
        }
    }
}
