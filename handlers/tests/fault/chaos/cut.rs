//! A TCP proxy between the workers and their database that, while cutting, ends a connection
//! at the worst moment: it forwards what the client sent (a statement, a `COMMIT`; now and
//! then a handshake's or a prepare's message) and closes the connection when the server's
//! answer comes, instead of passing it on. The server has most often run the statement (a
//! `COMMIT` has committed, an autocommit `UPDATE` is written); the worker cannot tell, and
//! hears only that its connection is gone, as through a failover, a cut link or a proxy that
//! drops it. Data the server sends unasked (a notice, a notification) ends it as well.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// One client message (a read of what the client sent) in this many has its answer lost while
/// the proxy cuts.
const ONE_IN: u32 = 12;

pub struct CutProxy {
    /// The proxy's URL for the database of the URL it was started with.
    pub url: String,
    cutting: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    /// Ends the accept loop (woken by a connection of [`Drop`]'s own).
    closed: Arc<AtomicBool>,
    port: u16,
}

impl CutProxy {
    /// A proxy for the database at `url` (`postgres://user@host:port/db` or `mysql://…`),
    /// not cutting until [`CutProxy::cut`].
    pub fn start(url: &str, seed: u64) -> CutProxy {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (user, rest) = rest.split_once('@').expect("user@host");
        let (server, db) = rest.split_once('/').expect("host:port/db");
        assert!(server.contains(':'), "a URL with a port: {url}");
        let server = server.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let cutting = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let (cutting_in, cuts_in, closed_in) =
            (Arc::clone(&cutting), Arc::clone(&cuts), Arc::clone(&closed));
        thread::spawn(move || {
            for (n, client) in listener.incoming().enumerate() {
                if closed_in.load(Ordering::SeqCst) {
                    return;
                }
                // A failed accept or connect costs that connection only (the client sees it
                // closed), never the proxy.
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    continue;
                };
                let mut rng = fastrand::Rng::with_seed(seed ^ (n as u64).wrapping_mul(0x9e37_79b9));
                let (cutting, cuts) = (Arc::clone(&cutting_in), Arc::clone(&cuts_in));
                crate::relay::relay(client, upstream, move |_| {
                    let cut = cutting.load(Ordering::SeqCst) && rng.u32(..ONE_IN) == 0;
                    if cut {
                        cuts.fetch_add(1, Ordering::SeqCst);
                    }
                    cut
                });
            }
        });
        CutProxy {
            url: format!("{scheme}://{user}@127.0.0.1:{port}/{db}"),
            cutting,
            cuts,
            closed,
            port,
        }
    }

    /// Starts or stops losing replies.
    pub fn cut(&self, on: bool) {
        self.cutting.store(on, Ordering::SeqCst);
    }

    /// How many connections were cut (each after what its client last sent reached the
    /// server).
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    /// Ends the accept loop; the relays end with their connections.
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
