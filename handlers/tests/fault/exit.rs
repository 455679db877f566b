//! A process that ends while one of its threads is opening a connection.
//!
//! Opening a PostgreSQL connection calls into libkrb5; a thread inside it while the process
//! exits can abort the process after its work is done (`outbox::db::prepare_exit`). The CLI
//! waits for such connections before it returns.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, task};
use crate::scenario::Scenario;

/// How long the relay holds back the server's first reply on each connection.
/// Less than the 3 s `outbox::cli::settle` waits at the most.
const HOLD: Duration = Duration::from_millis(1500);

#[test]
fn a_drain_ends_only_after_the_connection_a_thread_of_it_is_opening() {
    let sc = Scenario::start("exit_while_connecting", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    db.enqueue(&[task("fault.connect_late", 1, 0, 1)]);
    let mark = sc.path("relayed");
    let relay = Relay::start(upstream_of(&test_db.url_text), mark.clone());
    let connect_url = test_db
        .url_text
        .replacen(&upstream_of(&test_db.url_text), &relay.addr, 1);

    let args = sc.worker_args("drain", &[]);
    let mut drain = sc.spawn_with(
        "drain",
        &test_db.url_text,
        &args,
        &[
            ("OUTBOX_FAULT_CONNECT_URL", &connect_url),
            (
                "OUTBOX_FAULT_CONNECT_MARK",
                mark.to_str().expect("a UTF-8 path"),
            ),
        ],
    );
    let status = drain
        .wait_for_exit(Duration::from_secs(60))
        .expect("the drain exits");
    assert!(
        status.success(),
        "{} failed: {status}\n{}",
        drain.label,
        drain.stderr_text()
    );
    assert_eq!(db.in_state("done"), 1, "the task ran");

    // The process has exited, so its sockets are closed: the relay sees each end.
    let relayed = relay.wait_for_ends(Duration::from_secs(10));
    assert!(
        !relayed.is_empty(),
        "the thread's connection reached the relay"
    );
    for s in &relayed {
        assert!(
            s.client_closed >= s.released,
            "the process closed a connection {:?} before the server's reply was let through: \
             it exited while the connection was being opened",
            s.released.duration_since(s.client_closed)
        );
    }
    let log = drain.stderr_text();
    assert!(!log.contains("still being opened"), "{log}");
}

/// `host:port` of a server URL (`scheme://user@host:port/db…`, as the test server's).
fn upstream_of(url: &str) -> String {
    let after_at = &url[url.find('@').expect("a user in the URL") + 1..];
    let upstream = &after_at[..after_at.find('/').expect("a database in the URL")];
    assert!(
        upstream.contains(':'),
        "the relay needs a TCP host and port: {url}"
    );
    upstream.to_owned()
}

/// What the relay saw of one connection.
#[derive(Clone, Copy)]
struct Relayed {
    released: Instant,
    client_closed: Instant,
}

/// A TCP relay to the server that holds back each connection's first reply for [`HOLD`], and
/// writes the file `mark` once a connection has reached it.
struct Relay {
    addr: String,
    ended: Arc<Mutex<(usize, Vec<Relayed>)>>,
}

impl Relay {
    fn start(upstream: String, mark: PathBuf) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a relay port");
        let addr = listener
            .local_addr()
            .expect("the relay's address")
            .to_string();
        let ended = Arc::new(Mutex::new((0, Vec::new())));
        let seen = Arc::clone(&ended);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let client = client.expect("a relayed connection");
                seen.lock().unwrap().0 += 1;
                std::fs::write(&mark, b"").expect("the mark file");
                let upstream = upstream.clone();
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || relay(client, &upstream, &seen));
            }
        });
        Relay { addr, ended }
    }

    /// What the relay saw of every connection, once each has ended (fails after `limit`).
    fn wait_for_ends(&self, limit: Duration) -> Vec<Relayed> {
        let deadline = Instant::now() + limit;
        loop {
            {
                let ended = self.ended.lock().unwrap();
                if ended.1.len() == ended.0 {
                    return ended.1.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "a relayed connection never ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Relays one connection: the client's bytes at once, the server's after [`HOLD`].
fn relay(mut client: TcpStream, upstream: &str, ended: &Mutex<(usize, Vec<Relayed>)>) {
    let accepted = Instant::now();
    let mut server = TcpStream::connect(upstream).expect("the server");
    let (mut from_client, mut to_server) = (
        client.try_clone().expect("a socket"),
        server.try_clone().expect("a socket"),
    );
    let forward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Write);
        Instant::now()
    });
    std::thread::sleep(HOLD.saturating_sub(accepted.elapsed()));
    let released = Instant::now();
    let mut buf = [0u8; 8192];
    while let Ok(n) = server.read(&mut buf) {
        if n == 0 || client.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let client_closed = forward.join().expect("the forwarding thread");
    ended.lock().unwrap().1.push(Relayed {
        released,
        client_closed,
    });
}
