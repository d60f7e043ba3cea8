//! [`PgRecordStore`]: the record store in PostgreSQL, so any replica can resume any item.
//!
//! A replica stopped as planned is usually not restarted on the same disk (a replaced Pod lands on
//! another node), so its unfinished work must wait somewhere every replica reaches: here, a table
//! scoped by a service name, so several services can share one database. The crate creates and
//! versions its own schema at the first connection (idempotent, serialised by an advisory lock).
//!
//! Leases follow the same rules as every backend ([`planned_stop::record::rules::is_offered`]): an item's lease names
//! its owner (host, pid, start fingerprint). An owner on *this* host is looked up, so the items of
//! a dead one are offered again at once; an owner on another host keeps its items until its lease
//! expires. Expiry is judged on one clock, the database's (`clock_timestamp()`): every lease, renewal
//! and offer reads the time from the server, so replicas whose own clocks disagree (by seconds or by
//! hours) still agree on whose lease has lapsed. Rows are claimed with `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent claimers never
//! wait on each other and never take the same item.
//!
//! When the database cannot be reached at a stop, nothing is lost: with a spill directory
//! ([`PgRecordStore::spill_to`]) the items go to a [`FileRecordStore`] there and the outcome says
//! `spilled`; the next lease on that host pushes them to the database first.
//!
//! TLS is the application's: [`PgRecordStore::connector`] takes a function that connects
//! however it likes (`postgres-native-tls`, `tokio-postgres-rustls`) and spawns the connection.
//!
//! Why one connection of its own rather than a pool (`deadpool-postgres`, `bb8`): a replica's
//! store runs a few short transactions a minute, one at a time, so a pool's spare connections
//! and recycling buy nothing; and what the outage rules need, no pool gives. Every operation,
//! connecting and migrating included, is bounded by one timeout, so a stop never waits on a dead
//! server and spills instead; a connection abandoned by that timeout is never handed out again;
//! and the server process it left behind is remembered, so a lease that may have committed late
//! is released only once that process is done. With a pool these rules would still be written
//! here, around its checkout.

/// The README's example, compiled.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod acks;
mod aside;
mod config;
mod offer;
mod operations;
mod rows;
mod schema;

pub use config::pg_config;
pub use schema::SCHEMA_VERSION;

use planned_stop::record::FileRecordStore;
use planned_stop::record::Owner;
use planned_stop::record::rules::Liveness;
use planned_stop::record::rules::lease_end;
use planned_stop::record::{ItemState, Leased, Persisted, RecordFuture, RecordStore};
use planned_stop::record::{RecordError, StopRecord};
#[cfg(feature = "testing")]
use planned_stop::testing::Clock;
/// Without the `testing` feature nothing stands in for the database's clock: the store's
/// `clock` is always `None`, and this private trait only names its type.
#[cfg(not(feature = "testing"))]
trait Clock: Send + Sync {
    fn now(&self) -> chrono::DateTime<chrono::Utc>;
}
use rows::{COLUMNS, item_of, owner_key};
use schema::migrate;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{Client, Config, NoTls};

/// How long any one database operation may take before it fails (and a stop spills).
const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// A function that opens a connection: connects with `config`, spawns the connection task, and
/// returns the client (see [`PgRecordStore::connector`]).
pub type Connector = Arc<
    dyn Fn(Config) -> Pin<Box<dyn Future<Output = Result<Client, tokio_postgres::Error>> + Send>>
        + Send
        + Sync,
>;

type LivenessProbe = Arc<dyn Fn(&Owner) -> Liveness + Send + Sync>;

/// The record store in PostgreSQL, so any replica resumes any item: rows scoped by a service name
/// (one database serves several services), a schema the crate creates and versions itself, claims
/// with `FOR UPDATE SKIP LOCKED` (concurrent claimers never wait on each other or share an item),
/// leases judged on the database's clock (replicas whose clocks disagree still agree on expiry;
/// an owner on this host is looked up, one elsewhere keeps its items until its lease expires), and
/// with [`PgRecordStore::spill_to`] a local fallback when the database cannot be reached at a stop
/// (the outcome says `spilled`; the next lease on that host pushes the items). TLS is the
/// application's ([`PgRecordStore::connector`]).
///
/// ```no_run
/// # async fn f() -> Result<(), planned_stop::record::RecordError> {
/// use planned_stop::record::{FileRecordStore, RecordStore, Sharing};
/// use planned_stop_postgres::PgRecordStore;
/// let store = PgRecordStore::from_url("postgres://app@db/app", "billing-worker")?
///     .spill_to(FileRecordStore::open("/var/lib/billing", Sharing::Refused)?);
/// store.connect().await?; // optional: fail early, create the schema now
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgRecordStore {
    config: Config,
    service: String,
    connector: Connector,
    client: Arc<tokio::sync::Mutex<Option<Client>>>,
    /// The server process of the current connection (`pg_backend_pid()`), and of the last one
    /// abandoned by a timeout: what a timed-out call may still be doing on the server.
    backends: Arc<std::sync::Mutex<Backends>>,
    /// Stands in for the database's clock in tests; `None`: the database's own.
    clock: Option<Arc<dyn Clock>>,
    liveness: LivenessProbe,
    spill: Option<FileRecordStore>,
    timeout: Duration,
}

impl std::fmt::Debug for PgRecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRecordStore")
            .field("service", &self.service)
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .field("spill", &self.spill)
            .finish_non_exhaustive()
    }
}

fn backend(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> RecordError {
    RecordError::backend_caused_by(what, e)
}

/// Now, by the clock every lease of the database is judged on: the server's `clock_timestamp()`
/// (one clock for all replicas, whatever their own clocks say), or the test clock standing in
/// for it.
async fn db_now(
    clock: Option<&Arc<dyn Clock>>,
    client: &impl tokio_postgres::GenericClient,
) -> Result<chrono::DateTime<chrono::Utc>, RecordError> {
    if let Some(clock) = clock {
        return Ok(clock.now());
    }
    client
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| backend("read the database's clock", e))
}

/// See [`PgRecordStore::backends`].
#[derive(Debug, Default)]
struct Backends {
    current: Option<i32>,
    abandoned: Option<i32>,
}

impl PgRecordStore {
    /// A store for `service` in the database `config` names. Nothing is connected yet: the first
    /// operation (or [`PgRecordStore::connect`]) connects and creates the schema.
    pub fn new(config: Config, service: impl Into<String>) -> PgRecordStore {
        PgRecordStore {
            config,
            service: service.into(),
            connector: Arc::new(|config: Config| {
                Box::pin(async move {
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::warn!(error = %e, "the PostgreSQL connection ended");
                        }
                    });
                    Ok(client)
                })
            }),
            client: Arc::new(tokio::sync::Mutex::new(None)),
            backends: Arc::default(),
            clock: None,
            liveness: Arc::new(planned_stop::record::rules::liveness_here),
            spill: None,
            timeout: DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// [`PgRecordStore::new`] from a URL (`postgres://…`) or key=value string, with the `PG*`
    /// environment variables filling in what it leaves out ([`pg_config`]).
    pub fn from_url(url: &str, service: impl Into<String>) -> Result<PgRecordStore, RecordError> {
        Ok(PgRecordStore::new(pg_config(url)?, service))
    }

    /// Connects through `connector` instead of a plain (`NoTls`) connection: the place for TLS.
    /// The function must spawn the connection task and return the client.
    #[must_use]
    pub fn connector(mut self, connector: Connector) -> PgRecordStore {
        self.connector = connector;
        self
    }

    /// Keeps a stop's items in `spill` when the database cannot be reached at the stop; the next
    /// lease pushes them to the database.
    #[must_use]
    pub fn spill_to(mut self, spill: FileRecordStore) -> PgRecordStore {
        self.spill = Some(spill);
        self
    }

    /// Reads lease times from `clock` instead of the database's clock (`clock_timestamp()`), which
    /// judges every lease otherwise: `clock` stands in for the server's, for every replica that
    /// shares it. A test seam, with the `testing` feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> PgRecordStore {
        self.clock = Some(clock);
        self
    }

    /// Decides whether a lease's owner runs with `probe` instead of this host's process table. A
    /// test seam, with the `testing` feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    #[must_use]
    pub fn liveness(
        mut self,
        probe: impl Fn(&Owner) -> Liveness + Send + Sync + 'static,
    ) -> PgRecordStore {
        self.liveness = Arc::new(probe);
        self
    }

    /// How long one operation may take (default 3 s): a database that does not answer fails the
    /// operation rather than hanging a stop.
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> PgRecordStore {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The service name that scopes this store's items.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Every service name that ever started with this database (a start leases, and registers
    /// the name), sorted: so a tool can tell a service with nothing waiting from a mistyped name.
    pub async fn services(&self) -> Result<Vec<String>, RecordError> {
        self.run(|client| {
            Box::pin(async move {
                let rows = client
                    .query("SELECT service FROM planned_stop_services ORDER BY 1", &[])
                    .await
                    .map_err(|e| backend("list the services", e))?;
                Ok(rows
                    .iter()
                    .filter_map(|row| row.try_get::<_, String>(0).ok())
                    .collect())
            })
        })
        .await
    }

    /// Connects now (and creates or upgrades the schema), to fail early at start-up.
    pub async fn connect(&self) -> Result<(), RecordError> {
        self.run(|_| Box::pin(async { Ok(()) })).await
    }

    /// Runs `op` on a connected client (connecting, and migrating, first when needed), within the
    /// operation timeout. A connection that broke is replaced at the next operation.
    async fn run<T: Send>(
        &self,
        op: impl for<'c> FnOnce(
            &'c mut Client,
        )
            -> Pin<Box<dyn Future<Output = Result<T, RecordError>> + Send + 'c>>
        + Send,
    ) -> Result<T, RecordError> {
        let work = async {
            let mut guard = self.client.lock().await;
            if guard.as_ref().is_none_or(Client::is_closed) {
                let mut client = (self.connector)(self.config.clone())
                    .await
                    .map_err(|e| backend("cannot connect to PostgreSQL", e))?;
                migrate(&mut client).await?;
                let pid = client
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .ok()
                    .and_then(|row| row.try_get::<_, i32>(0).ok());
                if let Ok(mut backends) = self.backends.lock() {
                    backends.current = pid;
                }
                *guard = Some(client);
            }
            let client = guard.as_mut().expect("connected above");
            let result = op(client).await;
            if result.is_err() && client.is_closed() {
                *guard = None;
            }
            result
        };
        // Bound first, so the abandoned work (and its hold on the client) is dropped here.
        let finished = tokio::time::timeout(self.timeout, work).await;
        match finished {
            Ok(result) => result,
            Err(_) => {
                // Whatever was in flight is abandoned: the next operation connects afresh, and the
                // server process that may still be working on it is remembered.
                if let Ok(mut guard) = self.client.try_lock() {
                    *guard = None;
                    if let Ok(mut backends) = self.backends.lock() {
                        backends.abandoned = backends.current.take();
                    }
                }
                Err(RecordError::backend(format!(
                    "PostgreSQL did not answer within {:?}; is the server up and reachable?",
                    self.timeout
                )))
            }
        }
    }
}

impl RecordStore for PgRecordStore {
    fn persist<'a>(
        &'a self,
        stopper: &'a Owner,
        record: std::sync::Arc<StopRecord>,
    ) -> RecordFuture<'a, Persisted> {
        Box::pin(async move {
            match self.persist_db(stopper, &record).await {
                Ok(()) => Ok(Persisted::Durable),
                Err(e @ RecordError::Backend { .. }) => match &self.spill {
                    Some(spill) => {
                        tracing::warn!(error = %planned_stop_protocol::error_chain::ErrorChain(&e), dir = %spill.dir().display(),
                            "PostgreSQL is unreachable at the stop: the items are kept on this host and pushed at the next start");
                        // The spill keeps every item as this host's own: the lease of a handed-back
                        // item is in the database, and the push decides there (see push_spilled).
                        let mut own = StopRecord::clone(&record);
                        for item in &mut own.unfinished {
                            item.resumed = false;
                        }
                        spill.persist(stopper, own.into()).await?;
                        Ok(Persisted::Spilled {
                            reason: e.to_string(),
                        })
                    }
                    None => Err(e),
                },
                Err(e) => Err(e),
            }
        })
    }

    fn lease<'a>(
        &'a self,
        owner: &'a Owner,
        max: usize,
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<Leased>> {
        Box::pin(async move {
            if let Err(e) = self.push_spilled().await {
                tracing::warn!(error = %planned_stop_protocol::error_chain::ErrorChain(&e), "cannot push the spilled items yet; they stay on this host");
            }
            // Each call's leases carry its own `leased_at` (the database's time when the call
            // began): what a failed call may have taken (a commit that outlasted the timeout) can
            // be named and released. A call that failed before it read that time leased nothing.
            let stamp = Arc::new(std::sync::Mutex::new(None));
            let leased = self.lease_db(owner, max, lease_for, stamp.clone()).await;
            let stamp = stamp.lock().ok().and_then(|mut s| s.take());
            if let (Err(_), Some(stamp)) = (&leased, stamp) {
                self.release_uncertain(owner, stamp);
            }
            leased
        })
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<String>> {
        let service = self.service.clone();
        let key = owner_key(owner);
        let ids = ids.to_vec();
        let clock = self.clock.clone();
        Box::pin(self.run(move |client| {
            Box::pin(async move {
                let now = db_now(clock.as_ref(), client).await?;
                let expires_at = lease_end(now, lease_for);
                let rows = client
                    .query(
                        "UPDATE planned_stop_items SET leased_at = $4, lease_expires = $5 \
                         WHERE service = $1 AND lease_owner = $2 AND id = ANY($3) RETURNING id",
                        &[&service, &key, &ids, &now, &expires_at],
                    )
                    .await
                    .map_err(|e| backend("renew the leases", e))?;
                let renewed: std::collections::HashSet<String> =
                    rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
                Ok(ids.into_iter().filter(|id| renewed.contains(id)).collect())
            })
        }))
    }

    fn acknowledge<'a>(&'a self, owner: &'a Owner, id: &'a str) -> RecordFuture<'a, ()> {
        Box::pin(self.acknowledge_db(owner, id))
    }

    fn acknowledge_many<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
    ) -> RecordFuture<'a, Vec<Result<(), RecordError>>> {
        Box::pin(self.acknowledge_many_db(owner, ids))
    }

    fn release<'a>(&'a self, owner: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool> {
        Box::pin(self.release_db(owner, id))
    }

    fn hold_aside<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        reason: &'a str,
    ) -> RecordFuture<'a, ()> {
        Box::pin(self.hold_aside_db(owner, id, reason))
    }

    fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool> {
        let service = self.service.clone();
        let id = id.to_owned();
        let clock = self.clock.clone();
        Box::pin(self.run(move |client| {
            Box::pin(async move {
                let now = db_now(clock.as_ref(), client).await?;
                // The drop leaves a tombstone, as an acknowledgement does: a spilled copy of the
                // item pushed later is not brought back.
                let row = client
                    .query_one(
                        "WITH gone AS (DELETE FROM planned_stop_items WHERE service = $1 AND id = $2 RETURNING id), \
                         tomb AS (INSERT INTO planned_stop_acks (service, id, acked_by, acked_at) \
                         SELECT $1, id, 'operator (records drop)', $3 FROM gone ON CONFLICT DO NOTHING) \
                         SELECT count(*) FROM gone",
                        &[&service, &id, &now],
                    )
                    .await
                    .map_err(|e| backend("drop an item", e))?;
                Ok(row.try_get::<_, i64>(0).unwrap_or(0) > 0)
            })
        }))
    }

    fn list(&self) -> RecordFuture<'_, Vec<ItemState>> {
        let service = self.service.clone();
        Box::pin(self.run(move |client| {
            Box::pin(async move {
                let rows = client
                    .query(
                        &format!("SELECT {COLUMNS} FROM planned_stop_items WHERE service = $1 ORDER BY stopped_at, id"),
                        &[&service],
                    )
                    .await
                    .map_err(|e| backend("list the items", e))?;
                Ok(rows.iter().map(|row| item_of(row).0).collect())
            })
        }))
    }

    fn last_stop(&self) -> RecordFuture<'_, Option<StopRecord>> {
        let service = self.service.clone();
        Box::pin(self.run(move |client| {
            Box::pin(async move {
                let row = client
                    .query_opt(
                        "SELECT record FROM planned_stop_stops WHERE service = $1",
                        &[&service],
                    )
                    .await
                    .map_err(|e| backend("read the stop record", e))?;
                match row {
                    None => Ok(None),
                    Some(row) => row
                        .try_get::<_, Option<serde_json::Value>>(0)
                        .ok()
                        .flatten()
                        .map(serde_json::from_value)
                        .transpose()
                        .map_err(|e| backend("the stored stop record does not parse", e)),
                }
            })
        }))
    }
}
