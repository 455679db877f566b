//! The socket under a server connection, found from outside the client library.
//!
//! Neither diesel nor the client libraries under it let us at a connection's socket:
//! `MysqlConnection` keeps its `MYSQL` handle private, so MariaDB Connector/C's own read and
//! write timeouts (`MYSQL_OPT_READ_TIMEOUT`, set only through `mysql_options` on that handle)
//! cannot be set, and its reads wait in `poll` without a timeout; libpq's `PGconn` is as
//! private. So the socket is found the way a debugger would: the descriptors of this process
//! are listed before and after the driver connects (`/proc/self/fd`), and the one stream
//! socket that appeared, connected, is the connection's. We keep a duplicate of that
//! descriptor, which refers to the same socket for as long as we hold it (never to another
//! one that reuses the number), and act on the socket through it: TCP keepalives and
//! `TCP_USER_TIMEOUT` (MySQL; libpq sets its own from the URL), and `shutdown`, which wakes
//! the library's `poll` with end-of-file so that the statement fails as on a lost connection
//! (see [`super::reply`]).
//!
//! Linux only (`/proc`); elsewhere no socket is ever found and connections go without these
//! bounds.

use std::collections::HashSet;
use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The socket of one connection, through a descriptor of our own.
#[derive(Debug)]
pub(crate) struct Socket {
    fd: OwnedFd,
    tcp: bool,
}

/// Why no socket could be told for a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unfound {
    /// No connected stream socket appeared while the driver connected (or this platform has
    /// no `/proc/self/fd`).
    None,
    /// Several did (another thread of this process connected to the same port meanwhile).
    Several(usize),
    /// Another connection to the same server was still being opened after [`OPENING_WAIT`]
    /// (a server that accepts and never answers): this one was opened beside it, untold.
    Busy,
}

impl std::fmt::Display for Unfound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfound::None => f.write_str("no new connected socket was found"),
            Unfound::Several(n) => write!(f, "{n} new connected sockets were found, not one"),
            Unfound::Busy => write!(
                f,
                "another connection to the server was still being opened after {OPENING_WAIT:?}"
            ),
        }
    }
}

/// The TCP bounds set on a MySQL connection's socket (libpq sets the same on PostgreSQL's
/// from the URL's `keepalives_*` and `tcp_user_timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpBounds {
    /// Silence before the first keepalive probe.
    pub(crate) idle: Duration,
    /// Between probes.
    pub(crate) interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub(crate) count: u32,
    /// How long sent data may stay unacknowledged before the connection is dropped.
    pub(crate) user_timeout: Duration,
}

impl Socket {
    /// Shuts the socket down both ways: a read the client library waits in returns end of
    /// file (the statement fails as on a lost connection), and the server sees the
    /// connection close and rolls back its transaction.
    pub(crate) fn cut(&self) -> io::Result<()> {
        socket2::SockRef::from(&self.fd).shutdown(Shutdown::Both)
    }

    /// Sets TCP keepalives and `TCP_USER_TIMEOUT` (nothing on a Unix-domain socket).
    pub(crate) fn bound_tcp(&self, bounds: &TcpBounds) -> io::Result<()> {
        if !self.tcp {
            return Ok(());
        }
        let socket = socket2::SockRef::from(&self.fd);
        socket.set_keepalive(true)?;
        socket.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(bounds.idle)
                .with_interval(bounds.interval)
                .with_retries(bounds.count),
        )?;
        #[cfg(target_os = "linux")]
        socket.set_tcp_user_timeout(Some(bounds.user_timeout))?;
        Ok(())
    }
}

/// A connection being opened to one server: the sockets of the process before, taken while
/// no other connection of this process opens to that server (two opened at once could not
/// be told apart).
#[derive(Debug)]
pub(crate) struct Opening {
    server: String,
    port: Option<u16>,
    /// None when the turn was not had within [`OPENING_WAIT`].
    before: Option<Snapshot>,
}

/// How long a connection waits for its turn to be opened, while another to the same server
/// is being opened, before it is opened anyway, its socket untold: one that hangs (a server
/// that accepts and never answers) must not hold up every later one, the heartbeat's
/// included. PostgreSQL's take at most their connect timeout (10 s by default).
pub(crate) const OPENING_WAIT: Duration = Duration::from_secs(15);

/// The servers (`host:port` as the URL writes them) that a connection is being opened to.
static OPENING: Mutex<Vec<String>> = Mutex::new(Vec::new());
static OPENED: Condvar = Condvar::new();

impl Opening {
    /// Waits until no other connection of this process is being opened to `url`'s server,
    /// then lists the process's sockets.
    pub(crate) fn start(url: &str) -> Opening {
        Opening::start_within(url, OPENING_WAIT)
    }

    /// [`Opening::start`], waiting at most `wait` for the turn.
    fn start_within(url: &str, wait: Duration) -> Opening {
        let server = server_of(url).to_owned();
        let deadline = std::time::Instant::now() + wait;
        let mut opening = OPENING.lock().unwrap_or_else(PoisonError::into_inner);
        while opening.contains(&server) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Opening {
                    port: port_of(&server),
                    server,
                    before: None,
                };
            }
            opening = OPENED
                .wait_timeout(opening, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        opening.push(server.clone());
        drop(opening);
        Opening {
            port: port_of(&server),
            server,
            before: Some(snapshot()),
        }
    }

    /// The socket of the connection just opened (see [`opened_since`]); `default_port` is
    /// the server's when the URL names none.
    pub(crate) fn finish(self, default_port: u16) -> Result<Socket, Unfound> {
        match &self.before {
            Some(before) => opened_since(before, Some(self.port.unwrap_or(default_port))),
            None => Err(Unfound::Busy),
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if self.before.is_none() {
            // It never had the turn.
            return;
        }
        let mut opening = OPENING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = opening.iter().position(|s| *s == self.server) {
            opening.swap_remove(at);
        }
        OPENED.notify_all();
    }
}

/// The server part of a URL: `host[:port]` (several, comma-separated, for a multi-host
/// PostgreSQL URL), without the user and password.
fn server_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

/// The port of `host:port` (none for several hosts, or none written).
fn port_of(server: &str) -> Option<u16> {
    if server.contains(',') || server.ends_with(']') {
        return None;
    }
    server.rsplit_once(':')?.1.parse().ok()
}

/// The sockets of this process at one moment, by inode.
#[derive(Debug, Default)]
pub(crate) struct Snapshot(HashSet<u64>);

/// Lists the process's sockets now (none where `/proc/self/fd` is missing).
pub(crate) fn snapshot() -> Snapshot {
    Snapshot(sockets().into_iter().map(|(_, inode)| inode).collect())
}

/// The one connected stream socket opened since `before` and still open; with a `port`,
/// one whose peer has that port is preferred when several appeared (a TCP connection; a
/// Unix-domain one has no port).
pub(crate) fn opened_since(before: &Snapshot, port: Option<u16>) -> Result<Socket, Unfound> {
    let mut found: Vec<(Socket, Option<u16>)> = sockets()
        .into_iter()
        .filter(|(_, inode)| !before.0.contains(inode))
        .filter_map(|(fd, inode)| connected_stream(fd, inode))
        .collect();
    if found.len() > 1 {
        if let Some(port) = port {
            found.retain(|(_, peer_port)| *peer_port == Some(port));
        }
    }
    match found.len() {
        0 => Err(Unfound::None),
        1 => Ok(found.remove(0).0),
        n => Err(Unfound::Several(n)),
    }
}

/// This process's open sockets: `(descriptor, inode)`.
fn sockets() -> Vec<(i32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let fd: i32 = entry.file_name().to_str()?.parse().ok()?;
            let inode = socket_inode(&std::fs::read_link(entry.path()).ok()?)?;
            Some((fd, inode))
        })
        .collect()
}

/// The inode of a `/proc/self/fd` link's target if it names a socket (`socket:[1234]`).
fn socket_inode(target: &std::path::Path) -> Option<u64> {
    target
        .to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// A duplicate of descriptor `fd` if it still is socket `inode`, a connected stream socket
/// (TCP or Unix-domain), with its peer's port.
#[allow(unsafe_code)]
fn connected_stream(fd: i32, inode: u64) -> Option<(Socket, Option<u16>)> {
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: `fd` was listed open a moment ago and is only borrowed for the `dup` below. If
    // another thread closed it since, the duplicate fails, or clones whatever now holds the
    // number, which the inode check rejects; nothing else is done through the borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .ok()?;
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    if socket_inode(&target) != Some(inode) {
        return None;
    }
    let socket = socket2::SockRef::from(&fd);
    if socket.r#type().ok()? != socket2::Type::STREAM {
        return None;
    }
    let peer = socket.peer_addr().ok()?;
    let (tcp, port) = match peer.as_socket() {
        Some(address) => (true, Some(address.port())),
        None if peer.is_unix() => (false, None),
        None => return None,
    };
    Some((Socket { fd, tcp }, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_and_ports_are_read_from_urls() {
        assert_eq!(server_of("mysql://u:p@h:3307/db?x=1"), "h:3307");
        assert_eq!(port_of(server_of("mysql://u:p@h:3307/db")), Some(3307));
        assert_eq!(server_of("postgres://h/db"), "h");
        assert_eq!(port_of("h"), None);
        assert_eq!(port_of("[::1]:5433"), Some(5433));
        assert_eq!(port_of("[::1]"), None);
        assert_eq!(port_of("a:5432,b:5433"), None);
        assert_eq!(server_of("postgres://u@h1:1,h2:2/db"), "h1:1,h2:2");
    }

    /// A connection whose turn does not come within the wait is opened anyway, untold; the
    /// turn passes on when the one opening ends.
    #[test]
    fn a_connection_waits_for_its_turn_a_bounded_time() {
        let url = "mysql://u@turns.invalid:1/db";
        let first = Opening::start_within(url, Duration::from_millis(100));
        assert!(first.before.is_some());
        let started = std::time::Instant::now();
        let second = Opening::start_within(url, Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(second.finish(1).unwrap_err(), Unfound::Busy);
        drop(first);
        let third = Opening::start_within(url, Duration::from_millis(100));
        assert!(third.before.is_some(), "the turn passed on");
    }

    #[test]
    fn socket_links_name_their_inode() {
        assert_eq!(
            socket_inode(std::path::Path::new("socket:[4026532]")),
            Some(4026532)
        );
        assert_eq!(socket_inode(std::path::Path::new("/dev/null")), None);
        assert_eq!(socket_inode(std::path::Path::new("pipe:[12]")), None);
    }

    /// A TCP connection opened between two snapshots is found, with its peer's port; a
    /// listening socket, which has no peer, and a connection from before are not.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_one_connection_opened_since_a_snapshot_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let old = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_old_server_side, _) = listener.accept().unwrap();
        let before = snapshot();
        let new = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The server's side of the new connection is a new connected socket too, with the
        // client's port as its peer's: the port picks the client's side.
        let (server_side, _) = listener.accept().unwrap();
        let socket = opened_since(&before, Some(port)).expect("one socket");
        assert!(socket.tcp);
        socket.cut().unwrap();
        let mut buf = [0u8; 1];
        // The client's own descriptor reads end of file: the socket is the one shut down.
        use std::io::Read;
        assert_eq!((&new).read(&mut buf).unwrap(), 0);
        drop((old, server_side));
    }
}
