//! A server on a thread of its own, which owns the server's runtime: what the metrics endpoint
//! and the dashboard each run. Stopped, it stops accepting, lets the requests under way
//! finish for a grace period, and drops the rest.

use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use tokio::runtime::Runtime;
use tokio::sync::watch;

/// A running server: stopped and joined by [`Background::stop`] or when dropped.
#[derive(Debug)]
pub(crate) struct Background {
    name: &'static str,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

/// How a [`Background`] server stops.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grace {
    /// How long the requests under way may take to finish after a stop.
    pub(crate) requests: Duration,
    /// How long the runtime waits for its blocking work (a request's database read) at the
    /// end; zero: not at all.
    pub(crate) blocking: Duration,
}

impl Background {
    /// Serves `app` on `listener` (non-blocking) from a new thread `outbox-NAME` that runs
    /// `runtime` (see [`super::serve`]). `name` also names the server in the log. Fails when
    /// the thread cannot be spawned.
    pub(crate) fn spawn(
        name: &'static str,
        runtime: Runtime,
        listener: std::net::TcpListener,
        app: Router,
        grace: Grace,
    ) -> std::io::Result<Background> {
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(format!("outbox-{name}"))
            .spawn(move || run(name, runtime, listener, app, stopped, grace))?;
        Ok(Background {
            name,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the server and waits for its thread (see [`Grace`]).
    pub(crate) fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::warn!("{}: the server thread panicked", self.name);
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    name: &'static str,
    runtime: Runtime,
    listener: std::net::TcpListener,
    app: Router,
    mut stopped: watch::Receiver<bool>,
    grace: Grace,
) {
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                log::error!("{name}: cannot serve: {e}");
                return;
            }
        };
        let mut asked = stopped.clone();
        let shutdown = async move {
            let _ = asked.wait_for(|stop| *stop).await;
        };
        let serving = super::serve(name, listener, app, shutdown);
        tokio::pin!(serving);
        tokio::select! {
            () = serving.as_mut() => return,
            _ = stopped.wait_for(|stop| *stop) => {}
        }
        if tokio::time::timeout(grace.requests, serving).await.is_err() {
            log::warn!(
                "{name}: requests still under way {:?} after stop; dropped",
                grace.requests
            );
        }
    });
    if grace.blocking.is_zero() {
        runtime.shutdown_background();
    } else {
        runtime.shutdown_timeout(grace.blocking);
    }
}
