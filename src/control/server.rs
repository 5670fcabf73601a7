//! The agent's end of the control channel: a Unix socket, one request
//! and one answer per connection.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::peer::Peer;
use super::{Answer, Group, MAX_REQUEST, REQUEST_TIMEOUT, Request};

/// Why the control socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindError {
    /// Something other than a socket is where the socket goes.
    #[error(
        "[control] socket {}: something other than a socket is there; remove it or name another path",
        path.display()
    )]
    NotASocket { path: PathBuf },
    /// The socket cannot be made there.
    #[error("[control] socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Carries a request out for a peer that may ask (blocking: it writes
/// the state).
pub(crate) type Handler = Arc<dyn Fn(&Request, &Peer) -> Answer + Send + Sync>;

/// The bound socket, removed when dropped.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the control socket at `path`. The caller holds the state's lock,
/// so a socket already there was left by an agent that died: it goes.
/// Only the agent's user may connect (root always can), and with `group`
/// its members too (mode 0660, the socket given to that group).
pub(crate) fn bind(path: &Path, group: Option<&Group>) -> Result<ControlSocket, BindError> {
    let io = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(io)?,
        Ok(_) => {
            return Err(BindError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    let socket = ControlSocket {
        listener,
        path: path.to_path_buf(),
    };
    let mode = match group {
        Some(group) => {
            std::os::unix::fs::chown(path, None, Some(group.gid)).map_err(|e| {
                io(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot give it to group `{}` ({e}): the agent's user must be a member of it",
                        group.name
                    ),
                ))
            })?;
            0o660
        }
        None => 0o600,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    Ok(socket)
}

/// Serves `socket` until `stop` turns true: each connection's peer is
/// checked, its request read (bounded in size and time) and carried out
/// by `handler` on a blocking thread, and the answer written back.
pub(crate) async fn serve(
    socket: ControlSocket,
    agent_uid: u32,
    group: Option<Group>,
    handler: Handler,
    stop: tokio_util::sync::CancellationToken,
) {
    let group = Arc::new(group);
    let mut connections = tokio::task::JoinSet::new();
    let stopped = stop.cancelled_owned();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => break,
            accepted = socket.listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (handler, group) = (handler.clone(), group.clone());
                    connections.spawn(async move {
                        if let Err(e) = answer(stream, agent_uid, group.as_ref().as_ref(), handler).await {
                            tracing::debug!("control: a connection ended early: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("control: cannot accept a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // An answer under way is given; a request still being read is not
    // carried out.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

async fn answer(
    stream: UnixStream,
    agent_uid: u32,
    group: Option<&Group>,
    handler: Handler,
) -> io::Result<()> {
    let peer = Peer::of(&stream)?;
    let (read, mut write) = stream.into_split();
    let answer = match peer.allowed(agent_uid, group) {
        Err(refusal) => {
            tracing::warn!("control: refused {}: not allowed", peer.describe());
            Answer::refused(format!("{refusal}\n"))
        }
        Ok(()) => {
            let mut line = Vec::new();
            let mut reader = BufReader::new(read).take(MAX_REQUEST as u64 + 1);
            tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request too slow"))??;
            if line.len() > MAX_REQUEST {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request too large",
                ));
            }
            match serde_json::from_slice::<Request>(&line) {
                Err(e) => Answer::refused(format!(
                    "the agent cannot read this request ({e}): is this tend the agent's version?\n"
                )),
                Ok(request) => {
                    let handler = handler.clone();
                    let who = peer.clone();
                    let what = request.describe();
                    let answer = tokio::task::spawn_blocking(move || handler(&request, &who))
                        .await
                        .unwrap_or_else(|e| {
                            Answer::refused(format!("the agent failed carrying it out: {e}\n"))
                        });
                    tracing::info!(
                        "control: {what} by {}: {}",
                        peer.describe(),
                        if answer.code == 0 {
                            answer.stdout.trim()
                        } else {
                            answer.stderr.trim()
                        }
                    );
                    answer
                }
            }
        }
    };
    let mut bytes = serde_json::to_vec(&answer).map_err(io::Error::other)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}
