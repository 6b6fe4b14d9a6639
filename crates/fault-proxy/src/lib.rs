//! A fault-injecting HTTP proxy for tests and the benchmark: it sits between
//! the code under test and the emulator and, at a configured rate, answers
//! with the errors DynamoDB and Kinesis really return (throttling, 500, 503,
//! part of a `BatchWriteItem` unprocessed, part of a `PutRecords` failed),
//! resets connections or answers slowly. The choice of faults is a seeded
//! random sequence: the same seed and the same order of requests give the
//! same faults.

mod answer;
mod faults;
mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

use answer::handle;
pub use faults::{applicable, target, Fault, Service};
use state::State;

/// Fault rate and seed.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    /// Share of requests (0..1) that get a fault.
    pub rate: f64,
    /// Only these faults (where they apply); `None` = every fault that fits the operation.
    pub only: Option<&'static [Fault]>,
}

/// A request the proxy let through and then answered with a 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `DynamoDB.BatchWriteItem`, `Kinesis.PutRecords`...
    pub operation: String,
    /// The stream or table named in the request.
    pub target: String,
    /// Records (Kinesis) or write requests (DynamoDB batch) in it.
    pub entries: usize,
}

/// How requests share the way upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Any,
    OneAtATime,
    TransactionsAlone,
}

pub struct FaultProxy {
    pub endpoint: String,
    state: Arc<State>,
    stop: watch::Sender<bool>,
}

impl FaultProxy {
    /// Starts the proxy on a free 127.0.0.1 port in front of `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str, config: Config) -> std::io::Result<Self> {
        Self::launch(upstream, config, Lane::Any).await
    }

    /// A proxy without faults that lets one request at a time through. moto
    /// serves requests on many threads and applies `TransactWriteItems`
    /// without a lock (two concurrent transactions both pass their condition),
    /// where DynamoDB serializes the writes to an item: in front of moto this
    /// gives tests of concurrent writers DynamoDB's isolation. The clients
    /// still race (their reads and writes interleave request by request).
    pub async fn start_one_at_a_time(upstream: &str) -> std::io::Result<Self> {
        Self::launch(upstream, Config { seed: 0, rate: 0.0, only: Some(&[]) }, Lane::OneAtATime).await
    }

    /// A proxy without faults in front of moto where a `TransactWriteItems`
    /// is never upstream at the same time as any other request, and all other
    /// requests go at once. moto keeps a copy of what a transaction writes
    /// (the local moto_server: of the items it names) and a cancelled one (a
    /// failed condition: every `409` of an append) puts that copy back,
    /// undoing whatever other requests wrote to them meanwhile, acknowledged
    /// appends included; nor are its conditions checked and its writes made
    /// in one step. DynamoDB isolates a transaction from other writes; this
    /// gives the local stack the same.
    pub async fn start_transactions_alone(upstream: &str) -> std::io::Result<Self> {
        Self::launch(upstream, Config { seed: 0, rate: 0.0, only: Some(&[]) }, Lane::TransactionsAlone).await
    }

    async fn launch(upstream: &str, config: Config, lane: Lane) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            rate: config.rate,
            only: config.only,
            rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            counts: Mutex::new(BTreeMap::new()),
            applied: Mutex::new(Vec::new()),
            one_at_a_time: (lane == Lane::OneAtATime).then(|| tokio::sync::Mutex::new(())),
            transactions_alone: (lane == Lane::TransactionsAlone).then(|| tokio::sync::RwLock::new(())),
            refused_keys: Mutex::default(),
            kms_disabled: std::sync::atomic::AtomicBool::new(false),
        });
        let (stop, mut stopped) = watch::channel(false);
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let state = shared.clone();
                        tokio::spawn(async move {
                            let service = service_fn(move |req| handle(state.clone(), req));
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    _ = stopped.changed() => return,
                }
            }
        });
        Ok(Self { endpoint, state, stop })
    }

    /// Every request applied and then answered with a 500, in order.
    pub fn applied_then_failed(&self) -> Vec<Applied> {
        self.state.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// From now on (until [`Self::accept_partition_key`]) every `PutRecords`
    /// entry with this partition key fails with `ProvisionedThroughputExceededException`,
    /// as a shard kept over its limit by that key would answer; the other entries are stored.
    pub fn refuse_partition_key(&self, key: &str) {
        if let Ok(mut keys) = self.state.refused_keys.lock() {
            keys.insert(key.to_owned());
        }
    }

    pub fn accept_partition_key(&self, key: &str) {
        if let Ok(mut keys) = self.state.refused_keys.lock() {
            keys.remove(key);
        }
    }

    /// From now on (until called with `false`) every KMS request is answered
    /// `DisabledException`, as KMS answers one that uses a disabled key. moto
    /// 5.2 keeps encrypting and decrypting with a key `DisableKey` disabled.
    pub fn disable_kms_keys(&self, disabled: bool) {
        self.state.kms_disabled.store(disabled, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests seen and faults injected, by kind (`requests`, `faults`, then each fault's name).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.state.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
