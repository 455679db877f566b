//! The relay of the test proxies that lose a reply: the suite's
//! `proxy::CommitReplyLoser` and the seeded fault harness's `chaos::cut::CutProxy`
//! (`handlers/tests/fault`, which includes this file).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

/// Copies bytes both ways between `client` and `upstream`, on two threads of its own. `cut`
/// sees each read of what the client sent; when it says so, that read still goes to the
/// server, and the connection is closed both ways when the server's next bytes come, instead
/// of them: the server has run what was sent (a `COMMIT` has committed), and the client never
/// hears. Once per connection. What the client sends after a cut goes on to the server, so a
/// message with no answer (MySQL's `COM_STMT_CLOSE`) loses the next one's.
pub fn relay(
    client: TcpStream,
    upstream: TcpStream,
    mut cut: impl FnMut(&[u8]) -> bool + Send + 'static,
) {
    let (Ok(mut client_r), Ok(mut upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let (mut upstream_r, mut client_w) = (upstream, client);
    let swallow = Arc::new(AtomicBool::new(false));
    let swallow_in = Arc::clone(&swallow);
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match client_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !swallow_in.load(Ordering::SeqCst) && cut(&buf[..n]) {
                // Set before the message leaves: its answer is the next thing the server
                // sends on this connection.
                swallow_in.store(true, Ordering::SeqCst);
            }
            if upstream_w.write_all(&buf[..n]).is_err() {
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
            if swallow.load(Ordering::SeqCst) {
                // The server has run it; its answer goes nowhere.
                let _ = upstream_r.shutdown(Shutdown::Both);
                break;
            }
            if client_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client_w.shutdown(Shutdown::Both);
    });
}
