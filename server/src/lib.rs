//! `kiln serve`: an OpenAI-compatible HTTP server over kiln's continuous batching scheduler.
//!
//! The engine runs on a thread of its own ([`worker`]); the HTTP side (axum on tokio) reads
//! requests ([`protocol`]), submits them, and answers with whole responses or server-sent
//! events ([`routes`]). A bounded waiting queue answers 503 with `Retry-After` when full; a
//! client that disconnects cancels its request, whose slot is freed at the next step. On
//! SIGINT or SIGTERM the server stops admitting, lets the requests in flight finish until a
//! deadline, cancels the rest and returns.

pub mod error;
pub mod lockstep;
pub mod metrics;
pub mod protocol;
pub mod routes;
pub mod worker;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use kiln_engine::tokenizer::Tokenizer;

pub use worker::{EngineBuilder, EngineInfo};

/// How to serve.
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (printed once listening).
    pub port: u16,
    /// The model's id in requests and `/v1/models`.
    pub model: String,
    pub tokenizer: Option<Tokenizer>,
    /// End-of-sequence ids every request stops on (unless it asks `ignore_eos`).
    pub eos: Vec<u32>,
    /// Requests that may wait for a slot; one more is answered 503.
    pub max_waiting: usize,
    /// After a shutdown signal, how long requests in flight may run before they are cancelled.
    pub drain: Duration,
    /// Rank 0 of a tensor-parallel group: the other ranks follow its scheduler
    /// ([`lockstep`]); `None` for one engine.
    pub group: Option<std::sync::Arc<dyn kiln_runtime::collective::Communicator>>,
}

/// Binds the port, builds the engine (on its own thread), prints `kiln serve: listening on
/// http://ADDRESS` on standard output, and serves until SIGINT or SIGTERM (then drains as the
/// module doc says; a second signal, or the deadline passed by 2 s, closes what is left).
/// Returns an error when the engine stopped on an error of its own.
pub fn serve(options: ServeOptions, build: EngineBuilder) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    // The port first: a busy one is reported before the engine is built.
    let address = (options.host.as_str(), options.port);
    let listener = (runtime.block_on(tokio::net::TcpListener::bind(address)))
        .with_context(|| format!("listening on {}:{}", options.host, options.port))?;
    let local = listener.local_addr()?;
    let metrics = Arc::new(metrics::Metrics::new());
    let health = Arc::new(worker::Health::default());
    let tokenizer = options.tokenizer.map(Arc::new);
    let (commands, info, engine) = worker::spawn(
        build,
        tokenizer.clone(),
        options.max_waiting,
        metrics.clone(),
        health.clone(),
        options.group.clone(),
    )?;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let app = Arc::new(routes::App {
        model: options.model.clone(),
        tokenizer,
        eos: options.eos,
        info: info.clone(),
        commands: commands.clone(),
        metrics,
        health: health.clone(),
        draining: AtomicBool::new(false),
        counter: AtomicU64::new(0),
        started,
    });
    let drain = options.drain.min(MAX_DRAIN);
    runtime.block_on(async {
        println!(
            "kiln serve: listening on http://{local} (model `{}`, {} slots × {} positions, \
             {} programs, arena {} bytes, KV pool {} bytes)",
            options.model,
            info.slots,
            info.max_seq,
            info.programs,
            info.arena_bytes,
            info.pool_bytes
        );
        std::io::stdout().flush()?;
        let (signalled, on_signal) = tokio::sync::oneshot::channel();
        let shutdown = {
            let app = app.clone();
            async move {
                let signal = shutdown_signal().await;
                eprintln!(
                    "kiln serve: {signal}: admitting nothing more; requests in flight have \
                     {:.0} s",
                    drain.as_secs_f64()
                );
                app.draining.store(true, Ordering::SeqCst);
                let deadline = Instant::now() + drain;
                let _ = app.commands.send(worker::Command::Drain { deadline });
                let _ = signalled.send(());
            }
        };
        // Connections that outlive the drain (a client that stops reading, or never finishes
        // sending its request) are closed a little after its deadline, or at a second signal.
        let hard_stop = async move {
            if on_signal.await.is_err() {
                return std::future::pending().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(drain + GRACE) => "the drain deadline passed",
                signal = shutdown_signal() => signal,
            }
        };
        let server =
            axum::serve(listener, routes::router(app.clone())).with_graceful_shutdown(shutdown);
        tokio::select! {
            served = server => served.context("serving HTTP"),
            why = hard_stop => {
                eprintln!("kiln serve: {why}: closing the connections still open");
                Ok(())
            }
        }
    })?;
    runtime.shutdown_timeout(GRACE);
    drop(app);
    drop(commands);
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    let fatal = health.fatal.lock().ok().and_then(|f| f.clone());
    if let Some(error) = fatal {
        anyhow::bail!("kiln serve: {error}");
    }
    eprintln!("kiln serve: stopped");
    Ok(())
}

/// How long connections may stay open past the drain deadline.
const GRACE: Duration = Duration::from_secs(2);
/// The longest drain honoured (a larger `--drain-seconds` is cut to it).
const MAX_DRAIN: Duration = Duration::from_secs(24 * 3600);

/// Waits for SIGINT or SIGTERM; returns its name.
async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
