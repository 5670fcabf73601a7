//! A TCP proxy between tend and a PostgreSQL server that can lose a
//! response at the exact point it hurts: armed with a command tag
//! (`CREATE DATABASE`), it lets the server's `CommandComplete` for that
//! command be sent (the statement has committed: PostgreSQL sends it after
//! the commit) and, instead of forwarding it, cuts both connections. tend
//! sees a connection that died with its statement's fate unknown.
//!
//! Only the server's messages are parsed (type byte, length, payload);
//! connect with `sslmode=disable` so the stream is plain from the first
//! byte.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

#[derive(Default)]
struct State {
    /// The tag whose completion is lost, once.
    armed: Option<String>,
    /// The completions lost so far.
    cut: Vec<String>,
    /// Cut off: live connections were shut and new ones are closed at once.
    severed: bool,
    /// Every connection's client side, to shut at `sever`.
    live: Vec<TcpStream>,
}

pub struct PgProxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl PgProxy {
    /// Proxies 127.0.0.1:PORT to the server on `server_port`.
    pub fn start(server_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                {
                    let mut s = shared.lock().unwrap();
                    if s.severed {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    s.live.push(client.try_clone().unwrap());
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    continue;
                };
                let state = shared.clone();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                // Client to server: bytes as they come.
                thread::spawn(move || copy(c2, s2));
                // Server to client: message by message.
                thread::spawn(move || relay_server(server, client, &state));
            }
        });
        PgProxy { port, state }
    }

    /// The next `CommandComplete` whose tag starts with `tag` is lost and
    /// the connection cut.
    pub fn arm(&self, tag: &str) {
        self.state.lock().unwrap().armed = Some(tag.to_string());
    }

    /// A network partition: every connection through the proxy is cut and
    /// new ones are refused until [`PgProxy::heal`].
    pub fn sever(&self) {
        let mut s = self.state.lock().unwrap();
        s.severed = true;
        for stream in s.live.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.state.lock().unwrap().severed = false;
    }

    /// The tags of the completions lost so far.
    pub fn cut(&self) -> Vec<String> {
        self.state.lock().unwrap().cut.clone()
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn relay_server(mut server: TcpStream, mut client: TcpStream, state: &Mutex<State>) {
    loop {
        let mut header = [0u8; 5];
        if server.read_exact(&mut header).is_err() {
            break;
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if server.read_exact(&mut body).is_err() {
            break;
        }
        if header[0] == b'C' {
            let tag =
                String::from_utf8_lossy(body.split(|b| *b == 0).next().unwrap_or(&[])).into_owned();
            let mut s = state.lock().unwrap();
            if s.armed
                .as_deref()
                .is_some_and(|armed| tag.starts_with(armed))
            {
                s.armed = None;
                s.cut.push(tag);
                drop(s);
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                return;
            }
        }
        if client.write_all(&header).is_err() || client.write_all(&body).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}
