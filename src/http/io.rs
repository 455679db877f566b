//! A connection's idle timeout: a socket that fails a read or a write with `TimedOut` once
//! it has waited that long with no byte moving either way.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with an idle timeout. One clock serves both directions: it starts when a read or
/// a write must wait and none is already waiting, and any read or write that completes
/// stops it. hyper polls the connection's reads and writes from one task, so the one timer
/// wakes whichever waits.
pub(super) struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    /// Whether `deadline` runs: something waits and nothing has moved since.
    waiting: bool,
}

impl<S> IdleTimeout<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> IdleTimeout<S> {
        IdleTimeout {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
        }
    }

    /// After the inner socket returned `Pending`: starts the clock if it is not running,
    /// and fails once it has run out.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.waiting {
            self.waiting = true;
            let at = Instant::now() + self.timeout;
            self.deadline.as_mut().reset(at);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no byte moved for {:?}", self.timeout),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// After the inner socket returned `Ready`.
    fn moved<T>(&mut self, done: io::Result<T>) -> Poll<io::Result<T>> {
        self.waiting = false;
        Poll::Ready(done)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(done) => this.moved(done),
            Poll::Pending => this.pending(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(done) => this.moved(done),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(done) => this.moved(done),
            Poll::Pending => this.pending(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(done) => this.moved(done),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(done) => this.moved(done),
            Poll::Pending => this.pending(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn a_read_that_waits_too_long_times_out_and_one_that_moves_does_not() {
        runtime().block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(64);
            let mut ours = IdleTimeout::new(ours, Duration::from_millis(100));
            theirs.write_all(b"hi").await.unwrap();
            let mut buf = [0u8; 2];
            ours.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"hi");
            let e = ours.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        });
    }

    #[test]
    fn a_write_nobody_reads_times_out() {
        runtime().block_on(async {
            let (ours, _theirs) = tokio::io::duplex(64);
            let mut ours = IdleTimeout::new(ours, Duration::from_millis(100));
            let e = ours.write_all(&[0u8; 1024]).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        });
    }
}
