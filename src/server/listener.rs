//! The HTTP server's connections, bounded: at most [`max_connections`]
//! at once, each closed after [`IDLE`] without a byte in either direction
//! (a client that connects and sends nothing, or half a request, or never
//! reads the answer), or when a request it started sending is not
//! answered within [`REQUEST`] (a client that trickles its headers a byte
//! at a time: the server answers only once it has read them); and the
//! process's file limit raised to what it may be, so a crowd of idle
//! clients can neither exhaust it nor keep `/healthz` from answering.
//!
//! # Guarantees
//! * Accepting never ends the server: an error (too many open files, the
//!   network) is logged, once per kind, as what it is, and accepting goes
//!   on after a short pause.
//! * A connection over the cap waits in the kernel's backlog until one
//!   closes (at most [`IDLE`] later), never costing a file meanwhile.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A connection with no byte read or written for this long is closed.
/// More than a minute: Prometheus scraping every 60 s keeps its
/// keep-alive connection.
pub(crate) const IDLE: Duration = Duration::from_secs(75);
/// A request must be read and answered within this long from its first
/// byte (the header-read timeout, and the handler's).
pub(crate) const REQUEST: Duration = Duration::from_secs(30);

/// [`REQUEST`], or (test builds) the failpoint `request-timeout`'s
/// milliseconds.
fn request_timeout() -> Duration {
    use crate::process::failpoint::{REQUEST_TIMEOUT, fired};
    fired(REQUEST_TIMEOUT)
        .and_then(|ms| ms.parse().ok())
        .map_or(REQUEST, Duration::from_millis)
}
/// The most connections at once, whatever the file limit.
const MAX_CONNECTIONS: usize = 4096;
/// The file limit tend raises its own to, at most (the shipped unit sets
/// `LimitNOFILE=65536`).
const WANTED_FILES: u64 = 65_536;

/// Raises the soft limit on open files to the hard limit (at most
/// [`WANTED_FILES`]), as Go's runtime does: systemd's default soft limit is
/// 1,024. Returns the limit in force.
pub(crate) fn raise_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    let wanted = limit.rlim_max.min(WANTED_FILES).max(limit.rlim_cur);
    if wanted > limit.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: a valid pointer to an rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return wanted;
        }
    }
    limit.rlim_cur
}

/// The connection cap for a file limit: half of it (the rest is for the
/// state, the Git cache, providers), at most [`MAX_CONNECTIONS`].
pub(crate) fn max_connections(file_limit: u64) -> usize {
    usize::try_from(file_limit / 2)
        .unwrap_or(MAX_CONNECTIONS)
        .clamp(16, MAX_CONNECTIONS)
}

/// A TCP listener that hands out bounded connections.
pub(crate) struct BoundedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    /// The last accept error logged, so a storm logs once.
    last_error: Option<io::ErrorKind>,
}

impl BoundedListener {
    pub(crate) fn new(inner: TcpListener, max_connections: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max_connections)),
            last_error: None,
        }
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = BoundedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            // Never closed; were it, serving on without a cap beats stopping.
            Err(_) => Arc::new(Semaphore::new(1))
                .acquire_owned()
                .await
                .unwrap_or_else(|_| unreachable!("a new semaphore is open")),
        };
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    self.last_error = None;
                    return (BoundedStream::new(stream, permit), addr);
                }
                Err(e) => {
                    if self.last_error != Some(e.kind()) {
                        self.last_error = Some(e.kind());
                        if e.raw_os_error() == Some(libc::EMFILE)
                            || e.raw_os_error() == Some(libc::ENFILE)
                        {
                            tracing::warn!(
                                "server: cannot accept a connection: too many open files ({e}); raise LimitNOFILE in the unit, or find who holds so many connections"
                            );
                        } else {
                            tracing::warn!("server: cannot accept a connection: {e}");
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that holds one of the server's permits and closes after
/// [`IDLE`] without progress.
pub(crate) struct BoundedStream {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Pin<Box<Sleep>>,
    /// Set when a request's first byte is read, cleared by the answer.
    request: Option<Pin<Box<Sleep>>>,
    request_timeout: Duration,
}

impl BoundedStream {
    fn new(inner: TcpStream, permit: OwnedSemaphorePermit) -> Self {
        BoundedStream {
            inner,
            _permit: permit,
            idle: Box::pin(tokio::time::sleep(IDLE)),
            request: None,
            request_timeout: request_timeout(),
        }
    }

    fn progressed(&mut self) {
        self.idle.as_mut().reset(Instant::now() + IDLE);
    }

    /// `Pending` unless the connection has been idle too long, or a
    /// request went unanswered too long.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if let Some(request) = self.request.as_mut()
            && request.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "a request not read and answered in time",
            ));
        }
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "idle connection closed",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for BoundedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.progressed();
                    if self.request.is_none() {
                        let timeout = self.request_timeout;
                        self.request = Some(Box::pin(tokio::time::sleep(timeout)));
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for BoundedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                self.progressed();
                // Answering: the request was read in time.
                self.request = None;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::max_connections;

    #[test]
    fn the_cap_is_half_the_file_limit_within_bounds() {
        assert_eq!(max_connections(1024), 512);
        assert_eq!(max_connections(65_536), 4096);
        assert_eq!(max_connections(10), 16);
    }
}
