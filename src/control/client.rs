//! The command's end of the control channel.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Answer, Request};

/// How long an answer may take: the agent writes the state first.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The socket is there and refuses this user (file permissions).
    #[error(
        "the running agent's control socket {} refuses this user ({source}): run the command with sudo, or as a member of [control] group",
        path.display()
    )]
    Denied {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The agent took the request and did not answer.
    #[error(
        "the running agent did not answer on {} ({source}): whether it carried the request out is not known; `tend status` and the agent's log (journalctl -u tend) say",
        path.display()
    )]
    NoAnswer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Sends `request` to the agent listening at `socket`: its answer, or
/// `None` when no agent listens there (no socket, or nobody accepting).
pub(crate) fn send(socket: &Path, request: &Request) -> Result<Option<Answer>, ClientError> {
    let stream = match UnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(ClientError::Denied {
                path: socket.to_path_buf(),
                source: e,
            });
        }
        // Not a socket (ENOTSOCK, ECONNREFUSED on a stale file): nobody.
        Err(_) => return Ok(None),
    };
    let no_answer = |source| ClientError::NoAnswer {
        path: socket.to_path_buf(),
        source,
    };
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(super::REQUEST_TIMEOUT)))
        .map_err(no_answer)?;
    let mut line = serde_json::to_vec(request).map_err(|e| no_answer(io::Error::other(e)))?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(no_answer)?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .take(1024 * 1024)
        .read_line(&mut answer)
        .map_err(no_answer)?;
    serde_json::from_str(&answer)
        .map(Some)
        .map_err(|e| no_answer(io::Error::new(io::ErrorKind::InvalidData, e)))
}
