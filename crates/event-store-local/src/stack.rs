//! The whole pipeline in one process: emulator, resources, the HTTP server
//! (`load` and the `/streams` API), the entity table's stream feeding
//! `relay`, the event source feeding `pump` (which wakes the scan), the scan
//! schedule with its forks run in-process, the subscriptions tick and its runners, and a
//! counter on the playback stream.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::collections::HashMap;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::config::{
    ArchiveConfig, LoadConfig, PumpConfig, RelayConfig, ScanConfig, StreamsConfig, SubscriptionConfig,
};
use event_store::entity::http::StreamsApi;
use event_store::entity::relay::Relay;
use event_store::entity::EntityStore;
use event_store::load::Load;
use event_store::log::http::LogApi;
use event_store::log::tiers::Tiers;
use event_store::privacy::keys::Keys;
use event_store::privacy::Subjects;
use event_store::pump::Pump;
use event_store::scan::Scan;
use event_store::subscription::{Answer, Subscriptions};
use event_store::views::http::ViewsApi;
use event_store_emulator::invoke::{at_hop, recursive_loop, LocalInvoker, Queued};
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_bucket, create_streams, create_subject_key, create_tables};
use event_store_emulator::table_stream::{deliver_all, TableStreamReader};
use event_store_emulator::Emulator;
use event_store_fault_proxy::FaultProxy;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, warn};

use crate::settings::Settings;
use crate::source::{count_records, feed_pump, shard_ids, stream_arn, Batching, ShardReader};
use crate::stats::Stats;

/// Local invocations get the deadlines the template's timeouts give them in Lambda.
pub const SCAN_TIMEOUT: Duration = Duration::from_secs(120);
pub const PLAYBACK_TIMEOUT: Duration = Duration::from_secs(900);
pub const SUBSCRIPTIONS_TIMEOUT: Duration = Duration::from_secs(900);
pub const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(900);

pub struct Stack {
    pub settings: Settings,
    pub emulator: Emulator,
    pub dynamo: aws_sdk_dynamodb::Client,
    pub kinesis: aws_sdk_kinesis::Client,
    /// Lambda targets of subscriptions (moto runs functions only in Docker: locally, use Kinesis targets).
    pub lambda: aws_sdk_lambda::Client,
    pub region: String,
    /// The archive's bucket (`names.archive_bucket`): readers read archived slots from it.
    pub archive: Bucket,
    /// Subjects' keys (`names.key_table`, wrapped by the stage's KMS key): sealed events open with them.
    pub keys: Arc<Keys>,
    pub stats: Arc<Stats>,
    pub counter: RequestCounter,
    /// What the DynamoDB client talks to: the emulator, transactions alone (see [`Stack::start`]).
    _serial: Option<FaultProxy>,
}

impl Stack {
    /// Every item of `table`, page after page (the demo's checks; not a path events take).
    pub async fn scan_table(&self, table: &str) -> Result<Vec<HashMap<String, AttributeValue>>> {
        let (mut items, mut start) = (Vec::new(), None);
        loop {
            let page = self
                .dynamo
                .scan()
                .table_name(table)
                .set_exclusive_start_key(start)
                .send()
                .await
                .with_context(|| format!("scanning {table}"))?;
            items.extend(page.items().iter().cloned());
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(items);
            }
        }
    }

    /// Starts (or reuses) the emulator and creates the resources if missing.
    pub async fn start(settings: Settings) -> Result<Self> {
        let (port, moto) = (settings.emulator_port, settings.moto_server.clone());
        let emulator = tokio::task::spawn_blocking(move || Emulator::ensure(port, &moto)).await??;
        let sdk = event_store::aws_config().await;
        let counter = RequestCounter::default();
        // moto keeps a deep copy of all its tables while it applies a transaction and puts it
        // back when the transaction is cancelled (every 409 of an append), undoing what other
        // requests wrote meanwhile, acknowledged appends included; DynamoDB isolates a
        // transaction from other writes. The local stack's transactions go to moto alone
        // (other requests at once), so an acknowledged append is never lost (the demo's
        // contended stream checks it).
        let serial = match sdk.endpoint_url() {
            Some(endpoint) => Some(FaultProxy::start_transactions_alone(endpoint).await.context("the DynamoDB proxy")?),
            None => None,
        };
        let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
        if let Some(proxy) = &serial {
            config.set_endpoint_url(Some(proxy.endpoint.clone()));
        }
        let dynamo = aws_sdk_dynamodb::Client::from_conf(config.interceptor(counter.clone()).build());
        let kinesis = aws_sdk_kinesis::Client::from_conf(
            aws_sdk_kinesis::config::Builder::from(&sdk).interceptor(counter.clone()).build(),
        );
        create_tables(&dynamo, &settings.names).await.context("creating the tables")?;
        create_streams(&kinesis, &settings.names, settings.shards).await.context("creating the streams")?;
        let archive = Bucket::new(&sdk, settings.names.archive_bucket.clone());
        create_bucket(&archive.s3, &archive.name).await.context("creating the archive bucket")?;
        let kms = aws_sdk_kms::Client::new(&sdk);
        create_subject_key(&kms, &settings.names.subject_key_alias).await.context("creating the subjects' KMS key")?;
        let keys = event_store::privacy::key_store(
            &sdk,
            event_store::privacy::KeyStore::reading(settings.names.key_table.clone()),
        );
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_else(|| "us-east-1".into());
        let lambda = aws_sdk_lambda::Client::new(&sdk);
        Ok(Self {
            settings,
            emulator,
            dynamo,
            kinesis,
            lambda,
            region,
            archive,
            keys,
            stats: Arc::default(),
            counter,
            _serial: serial,
        })
    }

    /// Starts every service; they stop when `shutdown` turns true.
    pub async fn run_services(&self, shutdown: watch::Receiver<bool>) -> Result<JoinSet<()>> {
        let mut tasks = JoinSet::new();
        self.spawn_http_server(&mut tasks, &shutdown).await?;
        self.spawn_relay(&mut tasks, &shutdown).await?;

        // The scan's invocations: its schedule, its forks and continuations, and the pump's wakes;
        // the subscriptions': their schedule, runners and continuations, and, through the tick alias,
        // the awake scan's ticks.
        let (scan_invoker, scan_invocations) = LocalInvoker::with_recursion(recursive_loop("ScanFunction"));
        let (subs_invoker, subs_invocations) = LocalInvoker::with_recursion(recursive_loop("SubscriptionsFunction"));
        let (tick_invoker, tick_invocations) = LocalInvoker::channel();
        self.spawn_pump_and_playback_counter(&mut tasks, &scan_invoker, &shutdown).await?;
        self.spawn_scan(&mut tasks, (scan_invoker, scan_invocations), tick_invoker, &shutdown)?;
        self.spawn_subscriptions(&mut tasks, (subs_invoker, subs_invocations), tick_invocations, &shutdown)?;
        self.spawn_archiver(&mut tasks, &shutdown)?;
        Ok(tasks)
    }

    /// The HTTP server: `load` (the pixel, `/events`), the `/streams` API (with `/views` and `/log`), and the status glance.
    async fn spawn_http_server(&self, tasks: &mut JoinSet<()>, shutdown: &watch::Receiver<bool>) -> Result<()> {
        let names = &self.settings.names;
        let address = ("127.0.0.1", self.settings.port);
        let listener = TcpListener::bind(address).await.with_context(|| format!("binding 127.0.0.1:{}", address.1))?;
        // The log as the streams function reads it: for its pages, and for the event stream.
        let log_api = || -> Result<LogApi> {
            Ok(LogApi {
                dynamo: self.dynamo.clone(),
                event_table: names.event_table.clone(),
                dedupe_window_ms: StreamsConfig::from_env()?.dedupe_window_ms,
                tiers: Tiers::new(Some(self.archive.clone())).with_keys(Some(self.keys.clone())),
            })
        };
        let api = Arc::new(crate::http::Api {
            // Large events go to the stack's bucket, as `ARCHIVE_BUCKET` sends them in AWS.
            load: {
                let config = LoadConfig::from_env()?;
                let subjects = Subjects::configured(&event_store::aws_config().await, config.subjects.as_ref())?;
                Load::new(self.kinesis.clone(), config).with_archive(Some(self.archive.clone())).with_subjects(subjects)
            },
            streams: StreamsApi::new({
                let config = StreamsConfig::from_env()?;
                let subjects = Subjects::configured(&event_store::aws_config().await, config.subjects.as_ref())?;
                EntityStore::new(self.dynamo.clone(), names.entity_table.clone())
                    .with_archive(Some(self.archive.clone()), config.inline_max_bytes)
                    .with_subjects(subjects)
            })
            .with_views(Some(ViewsApi::new(self.dynamo.clone(), names.view_table.clone())))
            .with_log(Some(log_api()?)),
            log: Arc::new(log_api()?),
            glance: crate::glance::Glance {
                clients: event_store::status::Clients {
                    dynamo: self.dynamo.clone(),
                    kinesis: self.kinesis.clone(),
                    sqs: aws_sdk_sqs::Client::new(&event_store::aws_config().await),
                },
                // The local stack has no dead-letter queues: its services retry in place.
                resources: event_store::status::Resources {
                    event_table: names.event_table.clone(),
                    event_stream: names.event_stream.clone(),
                    queues: vec![],
                },
                archive: Some(self.archive.clone()),
                keys: Some(self.keys.clone()),
            },
            cors: crate::template::Template::project()?.cors()?,
        });
        tasks.spawn(crate::http::serve(listener, api, self.stats.clone(), shutdown.clone()));
        Ok(())
    }

    /// The entity table's DynamoDB stream feeds relay, as its event source mapping would.
    async fn spawn_relay(&self, tasks: &mut JoinSet<()>, shutdown: &watch::Receiver<bool>) -> Result<()> {
        let names = &self.settings.names;
        let streams_client = aws_sdk_dynamodbstreams::Client::new(&event_store::aws_config().await);
        let reader = TableStreamReader::open(&self.dynamo, streams_client, &names.entity_table, &self.region).await?;
        let sqs = aws_sdk_sqs::Client::new(&event_store::aws_config().await);
        let relay = Relay::new(self.kinesis.clone(), self.dynamo.clone(), sqs, RelayConfig::from_env()?);
        tasks.spawn(feed_relay(reader, relay, shutdown.clone()));
        Ok(())
    }

    /// The event stream's shards feed the pump (which wakes the scan through `scan`), and the
    /// playback stream's are counted.
    async fn spawn_pump_and_playback_counter(
        &self,
        tasks: &mut JoinSet<()>,
        scan: &LocalInvoker,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<()> {
        let names = &self.settings.names;
        let pump = Arc::new(
            Pump::new(self.dynamo.clone(), self.kinesis.clone(), PumpConfig::from_env()?)
                .with_scan(Some(Arc::new(scan.clone()))),
        );
        let arn = stream_arn(&self.kinesis, &names.event_stream).await?;
        for shard in shard_ids(&self.kinesis, &names.event_stream).await? {
            let reader = ShardReader::new(self.kinesis.clone(), &names.event_stream, &shard);
            tasks.spawn(feed_pump(
                reader,
                arn.clone(),
                self.region.clone(),
                pump.clone(),
                Batching { size: self.settings.batch_size, window: self.settings.batching_window },
                self.stats.clone(),
                shutdown.clone(),
            ));
        }
        for shard in shard_ids(&self.kinesis, &names.playback_stream).await? {
            let reader = ShardReader::new(self.kinesis.clone(), &names.playback_stream, &shard);
            tasks.spawn(count_records(reader, self.stats.clone(), shutdown.clone()));
        }
        Ok(())
    }

    /// The scan, run on its `invocations` and on its schedule; it ticks the subscriptions through `tick`.
    fn spawn_scan(
        &self,
        tasks: &mut JoinSet<()>,
        (scan_invoker, scan_invocations): (LocalInvoker, Invocations),
        tick_invoker: LocalInvoker,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<()> {
        let scan = Arc::new(
            Scan::new(
                self.dynamo.clone(),
                self.kinesis.clone(),
                ScanConfig::from_env()?,
                Arc::new(scan_invoker.clone()),
            )
            .with_subscriptions(Some(Arc::new(tick_invoker))),
        );
        let stats = self.stats.clone();
        tasks.spawn(run_invocations(scan_invocations, shutdown.clone(), move |payload| {
            let (scan, stats) = (scan.clone(), stats.clone());
            async move {
                match scan.handle(payload, SystemTime::now() + SCAN_TIMEOUT).await {
                    Ok(summary) => stats.add_moved(summary.moved as u64),
                    Err(err) => error!(error = %err, "scan invocation failed"),
                }
            }
        }));
        tasks.spawn(schedule(scan_invoker, self.settings.scan_interval, shutdown.clone()));
        Ok(())
    }

    /// Subscriptions: a tick on the same schedule, and whenever the awake scan moved the watermark
    /// (`tick_invocations`, through the tick alias).
    fn spawn_subscriptions(
        &self,
        tasks: &mut JoinSet<()>,
        (subs_invoker, subs_invocations): (LocalInvoker, Invocations),
        tick_invocations: Invocations,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<()> {
        let subscriptions = Arc::new(
            Subscriptions::new(
                self.dynamo.clone(),
                self.kinesis.clone(),
                self.lambda.clone(),
                SubscriptionConfig::from_env()?,
                Arc::new(subs_invoker.clone()),
            )
            .with_archive(Some(self.archive.clone()))
            .with_keys(Some(self.keys.clone())),
        );
        // The function's own ARN and its tick alias's, as Lambda's context gives them (the alias decides).
        let function = format!("arn:aws:lambda:{}:000000000000:function:subscriptions", self.region);
        let alias = format!("{function}:{}", event_store::subscription::TICK_ALIAS);
        for (invocations, invoked) in [(subs_invocations, function), (tick_invocations, alias)] {
            let (subscriptions, stats) = (subscriptions.clone(), self.stats.clone());
            tasks.spawn(run_invocations(invocations, shutdown.clone(), move |payload| {
                let (subscriptions, stats, invoked) = (subscriptions.clone(), stats.clone(), invoked.clone());
                async move {
                    let deadline = SystemTime::now() + SUBSCRIPTIONS_TIMEOUT;
                    match subscriptions.handle_invoked(&invoked, payload, deadline).await {
                        Ok(Answer::Ran(run)) => stats.add_delivered(run.delivered as u64),
                        Ok(_) => {}
                        Err(err) => error!(error = %err, "subscriptions invocation failed"),
                    }
                }
            }));
        }
        tasks.spawn(schedule(subs_invoker, self.settings.tick_interval, shutdown.clone()));
        Ok(())
    }

    /// The archiver on its schedule (`ArchiveRate`, or ARCHIVE_INTERVAL), and its continuations.
    fn spawn_archiver(&self, tasks: &mut JoinSet<()>, shutdown: &watch::Receiver<bool>) -> Result<()> {
        let (archive_invoker, archive_invocations) = LocalInvoker::with_recursion(recursive_loop("ArchiveFunction"));
        let archiver = Arc::new(Archiver {
            dynamo: self.dynamo.clone(),
            bucket: self.archive.clone(),
            config: ArchiveConfig::from_env()?,
        });
        let continuations = archive_invoker.clone();
        tasks.spawn(run_invocations(archive_invocations, shutdown.clone(), move |payload| {
            let (archiver, invoker) = (archiver.clone(), continuations.clone());
            async move {
                // The archiver logs its own summary.
                if let Err(err) = archiver.handle(payload, SystemTime::now() + ARCHIVE_TIMEOUT, &invoker).await {
                    error!(error = %err, "archiver invocation failed");
                }
            }
        }));
        // EventBridge's first event comes one rate after the rule is made: the local stack's
        // start does not archive at once (a restart would otherwise archive on every start).
        tasks.spawn(schedule_from(archive_invoker, self.settings.archive_interval, false, shutdown.clone()));
        Ok(())
    }
}

/// The payloads an invoker queues for one function (with their hop counts).
type Invocations = tokio::sync::mpsc::UnboundedReceiver<Queued>;

/// Lambda's asynchronous invocations of one function: each payload the
/// invoker queues runs as its own task, until `shutdown`.
async fn run_invocations<F, Fut>(mut invocations: Invocations, mut shutdown: watch::Receiver<bool>, handle: F)
where
    F: Fn(serde_json::Value) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        tokio::select! {
            Some((payload, hop)) = invocations.recv() => {
                tokio::spawn(at_hop(hop, handle(payload)));
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Relays the entity table's stream until shutdown: what is there, then a poll every `RELAY_POLL`.
async fn feed_relay(mut reader: TableStreamReader, relay: Relay, mut shutdown: watch::Receiver<bool>) {
    let mut pending = std::collections::VecDeque::new();
    while !*shutdown.borrow() {
        // The template's mapping: batches of 100, retried until they succeed.
        if let Err(err) = deliver_all(&mut reader, &mut pending, 100, u32::MAX, |event| relay.handle(event)).await {
            warn!(error = %err, "entity table stream read failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(RELAY_POLL) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// How often the local relay polls the entity table's stream (Lambda polls a DynamoDB stream 4 times a second).
const RELAY_POLL: Duration = Duration::from_millis(250);

/// The schedule: like EventBridge, it fires whether or not the last run has finished. The
/// first event comes at once (so a fresh local stack has a watermark without waiting a rate).
async fn schedule(invoker: LocalInvoker, interval: Duration, shutdown: watch::Receiver<bool>) {
    schedule_from(invoker, interval, true, shutdown).await
}

async fn schedule_from(invoker: LocalInvoker, interval: Duration, at_once: bool, mut shutdown: watch::Receiver<bool>) {
    let first = tokio::time::Instant::now() + if at_once { Duration::ZERO } else { interval };
    let mut ticks = tokio::time::interval_at(first, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                let event = json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
                if invoker.send(event).is_err() {
                    return;
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
