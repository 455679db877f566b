//! Clients that misbehave, for the HTTP servers' bounds (the metrics endpoint's and the
//! dashboard's): idle connections, a client that pipelines requests and never reads, a
//! request that must be answered within a time limit, and a process's threads and open
//! files as `/proc` counts them.

#![allow(dead_code)] // each test binary uses its part

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `n` connections to `addr` that send nothing. The kernel completes a connection the
/// server has not accepted yet, so they all open even past a server's cap.
pub fn idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("idle connection {i} to {addr}: {e}"))
        })
        .collect()
}

/// A connection that has written `GET path` requests (HTTP/1.1, keep-alive) until the
/// server stopped reading them and both sockets' buffers filled, or 4 MiB of them, and
/// never reads an answer.
pub fn pipelining(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let burst = request.repeat(256).into_bytes();
    stream.set_nonblocking(true).unwrap();
    let mut written = 0usize;
    // The buffers are full once writes have failed with WouldBlock for a while: the server
    // may still be reading, a little at a time.
    let mut blocked_since: Option<Instant> = None;
    while written < 4 << 20 {
        match stream.write(&burst) {
            Ok(n) => {
                written += n;
                blocked_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("pipelining to {addr}: {e}"),
        }
    }
    stream.set_nonblocking(false).unwrap();
    stream
}

/// `GET path` on a fresh connection, answered within `limit` (connect, send, the whole
/// answer): its status, or what went wrong.
pub fn answered_within(addr: SocketAddr, path: &str, limit: Duration) -> Result<u16, String> {
    let start = Instant::now();
    let left = || {
        limit
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("GET {path}: no answer within {limit:?}"))
    };
    let mut stream = TcpStream::connect_timeout(&addr, left()?)
        .map_err(|e| format!("GET {path}: connect: {e}"))?;
    stream.set_write_timeout(Some(left()?)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("GET {path}: send: {e}"))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        stream.set_read_timeout(Some(left()?)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("GET {path}: no answer within {limit:?}"))
            }
            Err(e) => return Err(format!("GET {path}: read: {e}")),
        }
    }
    left()?;
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path}: no status in {answer:?}"))
}

/// Whether the server closes `stream`, which has sent nothing, within `limit`.
pub fn closed_by_server_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    // Closed: end of file (or a reset). Still open at the limit: a timeout.
    !matches!(stream.read(&mut buf), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// The number of threads of process `pid`.
pub fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads line")
}

/// The number of files process `pid` has open.
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc fd")
        .count()
}

/// The soft open-file limit of process `pid`, as `/proc/<pid>/limits` writes it.
pub fn open_file_limit(pid: u32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc limits");
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a Max open files line")
        .to_owned()
}

/// Of the TCP connections to `port` (IPv4): how many process `pid` has accepted and holds,
/// and how many wait in the listening socket's accept queue, as `/proc/net/tcp` shows them.
pub fn accepted_and_waiting(pid: u32, port: u16) -> (usize, usize) {
    let ours: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).expect("/proc net tcp");
    let local = format!(":{port:04X}");
    let (mut held, mut waiting) = (0, 0);
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 10 || !fields[1].ends_with(&local) {
            continue;
        }
        match fields[3] {
            // ESTABLISHED, on a socket of the process.
            "01" if ours.contains(fields[9]) => held += 1,
            // LISTEN: rx_queue is the accept queue's length.
            "0A" => {
                let rx = fields[4].split(':').nth(1).unwrap_or("0");
                waiting += usize::from_str_radix(rx, 16).unwrap_or(0);
            }
            _ => {}
        }
    }
    (held, waiting)
}
