//! TCP proxies in front of the test servers. [`CommitReplyLoser`] (PostgreSQL, MySQL) can lose a
//! commit's reply: once a connection is armed (it sends [`CommitReplyLoser::ARM`], or the
//! text the proxy was started to watch for), it forwards the next `COMMIT` that connection
//! sends (a simple-query message, a `COM_QUERY`) and closes it both ways when the reply comes, so the server
//! commits and the client never hears so. One reply is lost per proxy.
//! [`ReplySwallower`] (PostgreSQL, MySQL) keeps a connection open and drops the server's
//! replies on it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// PostgreSQL's simple-query message `COMMIT`: type `Q`, length 11, the text and its NUL.
const PG_COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// MySQL's `COM_QUERY` packet `COMMIT`: length 7 (three bytes), sequence 0, command 3, the
/// text.
const MYSQL_COMMIT: &[u8] = b"\x07\0\0\0\x03COMMIT";

pub struct CommitReplyLoser {
    /// The proxy's URL for the database of `url`.
    pub url: String,
    lost: Arc<AtomicUsize>,
}

impl CommitReplyLoser {
    /// A proxy for the PostgreSQL database at `url` (`postgres://user@host:port/db`), armed
    /// by [`CommitReplyLoser::ARM`].
    pub fn start(url: &str) -> CommitReplyLoser {
        Self::start_on(url, Self::ARM)
    }

    /// A proxy for the database at `url` (`postgres://…` or `mysql://user@host:port/db`)
    /// armed on a connection by the first message that holds `mark` (a statement's text goes
    /// with its first execution on a connection: diesel prepares it then).
    pub fn start_on(url: &str, mark: &'static str) -> CommitReplyLoser {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let commit = if scheme == "mysql" {
            MYSQL_COMMIT
        } else {
            PG_COMMIT
        };
        let (user, rest) = rest.split_once('@').expect("user@host");
        let (server, db) = rest.split_once('/').expect("host:port/db");
        let server = server.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let lost = Arc::new(AtomicUsize::new(0));
        let lost_in = Arc::clone(&lost);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                // Armed by `mark`, then cut at the COMMIT: only the first of the proxy's.
                let lost = Arc::clone(&lost_in);
                let mut armed = false;
                crate::relay::relay(client, upstream, move |data| {
                    armed |= data.windows(mark.len()).any(|w| w == mark.as_bytes());
                    armed
                        && data.windows(commit.len()).any(|w| w == commit)
                        && lost
                            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                });
            }
        });
        CommitReplyLoser {
            url: format!("{scheme}://{user}@127.0.0.1:{port}/{db}"),
            lost,
        }
    }

    /// The statement that arms the connection it runs on: the reply of that connection's
    /// next COMMIT is lost. Only that connection's: another's commit (a heartbeat's, say)
    /// in between is left alone.
    pub const ARM: &'static str = "SELECT 'outbox test: lose the next commit reply'";

    /// How many commit replies were lost.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }
}

/// A TCP proxy in front of a PostgreSQL or MySQL test server that can swallow replies: once
/// told a connection (by the port it connects to the server from, which the server reports as
/// the client's), it goes on forwarding what the client sends on that connection, and drops
/// everything the server sends back, keeping the connection open. The client's request
/// reaches the server, which answers; the answer never reaches the client, and nothing at the
/// TCP level tells it so (the proxy's kernel acknowledges every byte).
pub struct ReplySwallower {
    /// The proxy's URL for the database of the server URL it was started with.
    pub url: String,
    swallowing: Arc<std::sync::Mutex<Vec<u16>>>,
    swallowed: Arc<AtomicUsize>,
    cut_by_client: Arc<AtomicUsize>,
    clients: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl ReplySwallower {
    /// A proxy for the database at `url` (`postgres://…` or `mysql://user@host:port/db`).
    pub fn start(url: &str) -> ReplySwallower {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (user, rest) = rest.split_once('@').expect("user@host");
        let (server, db) = rest.split_once('/').expect("host:port/db");
        let server = server.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let swallowing = Arc::new(std::sync::Mutex::new(Vec::new()));
        let swallowed = Arc::new(AtomicUsize::new(0));
        let cut_by_client = Arc::new(AtomicUsize::new(0));
        let clients = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (swallowing_in, swallowed_in, cut_in, clients_in) = (
            Arc::clone(&swallowing),
            Arc::clone(&swallowed),
            Arc::clone(&cut_by_client),
            Arc::clone(&clients),
        );
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                if let Ok(copy) = client.try_clone() {
                    clients_in.lock().unwrap().push(copy);
                }
                relay_swallowing(
                    client,
                    upstream,
                    Arc::clone(&swallowing_in),
                    Arc::clone(&swallowed_in),
                    Arc::clone(&cut_in),
                );
            }
        });
        ReplySwallower {
            url: format!("{scheme}://{user}@127.0.0.1:{port}/{db}"),
            swallowing,
            swallowed,
            cut_by_client,
            clients,
        }
    }

    /// Closes every connection through the proxy (a failed test's way out: the clients
    /// waiting for a swallowed reply fail, and their servers end their sessions).
    pub fn close_all(&self) {
        for client in self.clients.lock().unwrap().iter() {
            let _ = client.shutdown(Shutdown::Both);
        }
    }

    /// From now on, drops the server's replies on the connection whose server-side peer
    /// port is `port` (PostgreSQL's `inet_client_port()`, the port in MySQL's
    /// `information_schema.PROCESSLIST.HOST`).
    pub fn swallow(&self, port: u16) {
        self.swallowing.lock().unwrap().push(port);
    }

    /// Bytes of replies dropped.
    pub fn swallowed(&self) -> usize {
        self.swallowed.load(Ordering::SeqCst)
    }

    /// Connections whose replies were swallowed and that their client then closed.
    pub fn cut_by_client(&self) -> usize {
        self.cut_by_client.load(Ordering::SeqCst)
    }
}

/// Copies bytes both ways; the server's replies are dropped once the connection is named.
fn relay_swallowing(
    client: TcpStream,
    upstream: TcpStream,
    swallowing: Arc<std::sync::Mutex<Vec<u16>>>,
    swallowed: Arc<AtomicUsize>,
    cut_by_client: Arc<AtomicUsize>,
) {
    let port = upstream.local_addr().unwrap().port();
    let named = move || swallowing.lock().unwrap().contains(&port);
    let named_too = named.clone();
    let (mut client_r, mut upstream_w) =
        (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let (mut upstream_r, mut client_w) = (upstream, client);
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = client_r.read(&mut buf) {
            if upstream_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        if named_too() {
            cut_by_client.fetch_add(1, Ordering::SeqCst);
        }
        let _ = upstream_w.shutdown(Shutdown::Both);
        let _ = client_r.shutdown(Shutdown::Both);
    });
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = upstream_r.read(&mut buf) {
            if named() {
                swallowed.fetch_add(n, Ordering::SeqCst);
                continue;
            }
            if client_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client_w.shutdown(Shutdown::Both);
    });
}
