//! A TCP proxy in front of the test PostgreSQL server that can lose a commit's reply: once
//! armed, it forwards the next `COMMIT` a client sends (a simple-query message) and then
//! closes that connection both ways, so the server commits and the client never hears so.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// The simple-query message `COMMIT`: type `Q`, length 11, the text and its NUL.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

pub struct CommitReplyLoser {
    /// The proxy's URL for the database of `url`.
    pub url: String,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
}

impl CommitReplyLoser {
    /// A proxy for the PostgreSQL database at `url` (`postgres://user@host:port/db`).
    pub fn start(url: &str) -> CommitReplyLoser {
        let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
        let (user, rest) = rest.split_once('@').expect("user@host");
        let (server, db) = rest.split_once('/').expect("host:port/db");
        let server = server.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let (armed_in, lost_in) = (Arc::clone(&armed), Arc::clone(&lost));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                let (armed, lost) = (Arc::clone(&armed_in), Arc::clone(&lost_in));
                relay(client, upstream, armed, lost);
            }
        });
        CommitReplyLoser {
            url: format!("postgres://{user}@127.0.0.1:{port}/{db}"),
            armed,
            lost,
        }
    }

    /// Loses the reply of the next COMMIT any client sends.
    pub fn arm(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.armed)
    }

    /// How many commit replies were lost.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }
}

/// Copies bytes both ways; the client's side is watched for an armed COMMIT.
fn relay(client: TcpStream, upstream: TcpStream, armed: Arc<AtomicBool>, lost: Arc<AtomicUsize>) {
    let (mut client_r, mut upstream_w) =
        (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let (mut upstream_r, mut client_w) = (upstream, client);
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match client_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let data = &buf[..n];
            if upstream_w.write_all(data).is_err() {
                break;
            }
            let commits = data.windows(COMMIT.len()).any(|w| w == COMMIT);
            if commits && armed.swap(false, Ordering::SeqCst) {
                // The server has the COMMIT; its reply goes nowhere.
                lost.fetch_add(1, Ordering::SeqCst);
                let _ = upstream_w.shutdown(Shutdown::Both);
                let _ = client_r.shutdown(Shutdown::Both);
                break;
            }
        }
        let _ = upstream_w.shutdown(Shutdown::Both);
    });
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match upstream_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if client_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client_w.shutdown(Shutdown::Both);
    });
}
