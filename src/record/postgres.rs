//! [`PgRecordStore`]: the record store in PostgreSQL, so any replica can resume any item.
//!
//! A replica stopped as planned is usually not restarted on the same disk (a replaced Pod lands on
//! another node), so its unfinished work must wait somewhere every replica reaches: here, a table
//! scoped by a service name, so several services can share one database. The crate creates and
//! versions its own schema at the first connection (idempotent, serialised by an advisory lock).
//!
//! Leases follow the same rules as every backend ([`crate::is_offered`]): an item's lease names
//! its owner (host, pid, start fingerprint). An owner on *this* host is looked up, so the items of
//! a dead one are offered again at once; an owner on another host keeps its items until its lease
//! expires. Rows are claimed with `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent claimers never
//! wait on each other and never take the same item.
//!
//! When the database cannot be reached at a stop, nothing is lost: with a spill directory
//! ([`PgRecordStore::spill_to`]) the items go to a [`FileRecordStore`] there and the outcome says
//! `spilled`; the next lease on that host pushes them to the database first.
//!
//! TLS is the application's: [`PgRecordStore::with_connector`] takes a function that connects
//! however it likes (`postgres-native-tls`, `tokio-postgres-rustls`) and spawns the connection.

use super::file::FileRecordStore;
use super::lease::{self, Lease, Liveness, Owner};
use super::store::{
    ItemState, Leased, Persisted, RecordFuture, RecordStore, ResumeItem, checked_item, lease_end,
};
use super::{RecordError, StopRecord};
use crate::clock::{Clock, SystemClock};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{Client, Config, NoTls, Row};

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 3;

/// How long any one database operation may take before it fails (and a stop spills).
pub(crate) const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// A function that opens a connection: connects with `config`, spawns the connection task, and
/// returns the client (see [`PgRecordStore::with_connector`]).
pub type Connector = Arc<
    dyn Fn(Config) -> Pin<Box<dyn Future<Output = Result<Client, tokio_postgres::Error>> + Send>>
        + Send
        + Sync,
>;

type LivenessProbe = Arc<dyn Fn(&Owner) -> Liveness + Send + Sync>;

/// The record store in PostgreSQL. See the module docs.
///
/// ```no_run
/// # async fn f() -> Result<(), planned_stop::RecordError> {
/// use planned_stop::{PgRecordStore, RecordStore};
/// let store = PgRecordStore::from_url("postgres://app@db/app", "billing-worker")?
///     .spill_to(planned_stop::FileRecordStore::open("/var/lib/billing", false)?);
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
    clock: Arc<dyn Clock>,
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

/// A connection string with libpq's environment defaults filled in: `PGHOST`, `PGPORT`, `PGUSER`,
/// `PGPASSWORD`, `PGDATABASE`, `PGAPPNAME` and `PGCONNECT_TIMEOUT` supply what `url` leaves out (an
/// empty `url` takes everything from the environment).
///
/// ```
/// let config = planned_stop::pg_config("postgres://app@db.internal:6432/jobs").unwrap();
/// assert_eq!(config.get_dbname(), Some("jobs"));
/// assert!(planned_stop::pg_config("postgres://[::1").is_err());
/// ```
pub fn pg_config(url: &str) -> Result<Config, RecordError> {
    let mut config: Config = if url.trim().is_empty() {
        Config::new()
    } else {
        url.parse()
            .map_err(|e| backend("not a PostgreSQL connection string (postgres://user@host:port/db or key=value pairs)", e))?
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(hosts) => hosts.split(',').for_each(|h| {
                config.host(h);
            }),
            None => {
                config.host("localhost");
            }
        }
    }
    if config.get_ports().is_empty()
        && let Some(port) = env("PGPORT").and_then(|p| p.parse().ok())
    {
        config.port(port);
    }
    if config.get_user().is_none() {
        let user = env("PGUSER")
            .or_else(|| env("USER"))
            .unwrap_or_else(|| "postgres".into());
        config.user(&user);
    }
    if config.get_password().is_none()
        && let Some(password) = env("PGPASSWORD")
    {
        config.password(password);
    }
    if config.get_dbname().is_none()
        && let Some(db) = env("PGDATABASE")
    {
        config.dbname(&db);
    }
    if config.get_application_name().is_none() {
        config.application_name(env("PGAPPNAME").unwrap_or_else(|| "planned-stop".into()));
    }
    if config.get_connect_timeout().is_none() {
        let secs = env("PGCONNECT_TIMEOUT")
            .and_then(|t| t.parse().ok())
            .unwrap_or(2);
        config.connect_timeout(Duration::from_secs(secs));
    }
    Ok(config)
}

/// See [`PgRecordStore::backends`].
#[derive(Debug, Default)]
struct Backends {
    current: Option<i32>,
    abandoned: Option<i32>,
}

/// The encoded owner, one column the queries compare: `host|pid|start`.
fn owner_key(owner: &Owner) -> String {
    format!("{}|{}|{}", owner.host, owner.pid, owner.start)
}

/// A fingerprint as PostgreSQL's `bigint`, bit for bit (and back).
fn as_i64(v: u64) -> i64 {
    v as i64
}

/// One column of a row, or its type's default with the problem noted: a hand-edited row (a NULL,
/// another type) is reported, never a panic.
fn col<T>(row: &Row, name: &str, problems: &mut Vec<String>) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a> + Default,
{
    match row.try_get::<_, Option<T>>(name) {
        Ok(Some(value)) => value,
        Ok(None) => {
            problems.push(format!("{name} is NULL"));
            T::default()
        }
        Err(e) => {
            problems.push(format!("{name}: {e}"));
            T::default()
        }
    }
}

/// A process id from its `bigint` column, noting one out of range.
fn pid_of(value: i64, name: &str, problems: &mut Vec<String>) -> u32 {
    u32::try_from(value).unwrap_or_else(|_| {
        problems.push(format!("{name} {value} is not a process id"));
        0
    })
}

/// An item row as the crate reads it, and why it cannot be accepted, if it cannot (a NULL where
/// a value belongs, an id that is not an item id, a negative count, a lease without its owner or
/// expiry, or a quarantine already recorded). A row with a problem is quarantined: listed, never
/// offered, never handed out under a new id.
fn item_of(row: &Row) -> (ItemState, Option<String>) {
    let mut problems = Vec::new();
    let p = &mut problems;
    let id: String = col(row, "id", p);
    if !lease::is_valid_item_id(&id) {
        p.push(format!(
            "{id:?} is not an item id (1 to 128 of A-Z a-z 0-9 - _)"
        ));
    }
    let attempts: i32 = col(row, "attempts", p);
    if attempts < 0 {
        p.push(format!("attempts {attempts} is negative"));
    }
    let by_pid: i64 = col(row, "stopped_by_pid", p);
    let item = ResumeItem {
        participant: col(row, "participant", p),
        item: col(row, "item", p),
        stopped_by: Owner::new(
            col::<String>(row, "stopped_by_host", p),
            pid_of(by_pid, "stopped_by_pid", p),
            col::<i64>(row, "stopped_by_start", p) as u64,
        ),
        stopped_at: col(row, "stopped_at", p),
        attempts: u32::try_from(attempts).unwrap_or(0),
        id,
    };
    let lease = match row.try_get::<_, Option<String>>("lease_owner") {
        Ok(None) => None,
        Ok(Some(_)) => {
            let pid: i64 = col(row, "lease_pid", p);
            Some(Lease::new(
                Owner::new(
                    col::<String>(row, "lease_host", p),
                    pid_of(pid, "lease_pid", p),
                    col::<i64>(row, "lease_start", p) as u64,
                ),
                col(row, "leased_at", p),
                col(row, "lease_expires", p),
            ))
        }
        Err(e) => {
            p.push(format!("lease_owner: {e}"));
            None
        }
    };
    let recorded = row
        .try_get::<_, Option<String>>("quarantined")
        .ok()
        .flatten();
    let problem = recorded.or_else(|| (!problems.is_empty()).then(|| problems.join("; ")));
    (
        ItemState {
            item,
            lease,
            quarantined: problem.clone(),
        },
        problem,
    )
}

const COLUMNS: &str = "id, participant, item, stopped_by_host, stopped_by_pid, stopped_by_start, \
    stopped_at, attempts, lease_owner, lease_host, lease_pid, lease_start, leased_at, lease_expires, \
    quarantined";

const MIGRATIONS: [&str; 3] = [
    // 1: items with their lease, acknowledgements, the last stop per service.
    "CREATE TABLE planned_stop_items (
        service text NOT NULL,
        id text NOT NULL,
        participant text NOT NULL,
        item jsonb NOT NULL,
        stopped_by_host text NOT NULL,
        stopped_by_pid bigint NOT NULL,
        stopped_by_start bigint NOT NULL,
        stopped_at timestamptz NOT NULL,
        attempts integer NOT NULL,
        lease_owner text,
        lease_host text,
        lease_pid bigint,
        lease_start bigint,
        leased_at timestamptz,
        lease_expires timestamptz,
        PRIMARY KEY (service, id)
     );
     CREATE INDEX planned_stop_items_order ON planned_stop_items (service, stopped_at, id);
     CREATE TABLE planned_stop_acks (
        service text NOT NULL,
        id text NOT NULL,
        acked_by text NOT NULL,
        acked_at timestamptz NOT NULL,
        PRIMARY KEY (service, id)
     );
     CREATE TABLE planned_stop_stops (
        service text PRIMARY KEY,
        record jsonb NOT NULL,
        written_at timestamptz NOT NULL
     );",
    // 2: rows the crate cannot accept are quarantined (the reason), never offered again.
    "ALTER TABLE planned_stop_items ADD COLUMN quarantined text;",
    // 3: the services that ever started with this database, so an operator's mistyped
    // `--service` is told from a service with nothing waiting. Those known so far are the ones
    // with a row anywhere.
    "CREATE TABLE planned_stop_services (
        service text PRIMARY KEY,
        first_seen timestamptz NOT NULL,
        last_seen timestamptz NOT NULL
     );
     INSERT INTO planned_stop_services (service, first_seen, last_seen)
        SELECT service, now(), now() FROM (
            SELECT service FROM planned_stop_items UNION SELECT service FROM planned_stop_acks
            UNION SELECT service FROM planned_stop_stops
        ) AS known;",
];

/// Creates or upgrades the schema, once per database whatever the number of replicas starting.
async fn migrate(client: &mut Client) -> Result<(), RecordError> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| backend("cannot begin the schema migration", e))?;
    // Any constant: it serialises migrators, and it is released with the transaction.
    tx.execute("SELECT pg_advisory_xact_lock(7311042219)", &[])
        .await
        .map_err(|e| backend("cannot lock the schema migration", e))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS planned_stop_schema (version integer NOT NULL)")
        .await
        .map_err(|e| backend("cannot create the schema version table", e))?;
    let rows = tx
        .query("SELECT version FROM planned_stop_schema", &[])
        .await
        .map_err(|e| backend("cannot read the schema version", e))?;
    let version: i32 = match rows.first().map(|r| r.try_get::<_, Option<i32>>(0)) {
        None => 0,
        Some(Ok(Some(version))) if version >= 0 => version,
        Some(found) => {
            return Err(RecordError::backend(format!(
                "planned_stop_schema holds no schema version the crate can read ({found:?}); \
                     fix or drop the table by hand"
            )));
        }
    };
    if version > SCHEMA_VERSION {
        return Err(RecordError::backend(format!(
            "the database's planned-stop schema is version {version}, newer than this build's \
                 {SCHEMA_VERSION}; upgrade this service"
        )));
    }
    for (index, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(step)
            .await
            .map_err(|e| backend(&format!("schema migration {} failed", index + 1), e))?;
    }
    if version < SCHEMA_VERSION {
        tx.execute("DELETE FROM planned_stop_schema", &[])
            .await
            .map_err(|e| backend("cannot record the schema version", e))?;
        tx.execute(
            "INSERT INTO planned_stop_schema (version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(|e| backend("cannot record the schema version", e))?;
    }
    tx.commit()
        .await
        .map_err(|e| backend("cannot commit the schema migration", e))
}

/// Marks a row the crate cannot accept, once: it keeps its data for the operator (`records list`
/// shows it with the reason) and loses any lease, and no lease ever offers it again.
async fn quarantine(
    tx: &tokio_postgres::Transaction<'_>,
    service: &str,
    id: &str,
    reason: &str,
) -> Result<(), RecordError> {
    tracing::warn!(
        id,
        reason,
        "an item row the crate cannot accept is quarantined: never \
        offered again; `planned-stop records list` shows it, `records drop` removes it"
    );
    tx.execute(
        "UPDATE planned_stop_items SET quarantined = $3, lease_owner = NULL, lease_host = NULL, \
         lease_pid = NULL, lease_start = NULL, leased_at = NULL, lease_expires = NULL \
         WHERE service = $1 AND id = $2",
        &[&service, &id, &reason],
    )
    .await
    .map(|_| ())
    .map_err(|e| backend("quarantine an item row", e))
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
            clock: Arc::new(SystemClock),
            liveness: Arc::new(Owner::liveness_here),
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
    pub fn with_connector(mut self, connector: Connector) -> PgRecordStore {
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

    /// Reads lease times from `clock` (tests).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> PgRecordStore {
        self.clock = clock;
        self
    }

    /// Decides whether a lease's owner runs with `probe` (tests).
    #[must_use]
    pub fn with_liveness(
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

    async fn persist_db(&self, stopper: &Owner, record: &StopRecord) -> Result<(), RecordError> {
        let service = self.service.clone();
        let stopper = stopper.clone();
        let record = record.clone();
        self.run(move |client| {
            Box::pin(async move {
                // New work and handed-back items apart: a handed-back item is written again only
                // while this process holds it (`attempts_after_persist`, the rule every store
                // follows), so an acknowledgement or an operator's drop is never undone.
                let (mut ids, mut participants, mut values) = (Vec::new(), Vec::new(), Vec::new());
                let (mut back, mut back_participants, mut back_values) =
                    (Vec::new(), Vec::new(), Vec::new());
                for unfinished in &record.unfinished {
                    let id = checked_item(unfinished).map_err(|reason| RecordError::Invalid {
                        path: "postgres".into(),
                        reason,
                    })?;
                    let (ids, participants, values) = if unfinished.resumed {
                        (&mut back, &mut back_participants, &mut back_values)
                    } else {
                        (&mut ids, &mut participants, &mut values)
                    };
                    ids.push(id.to_owned());
                    participants.push(unfinished.participant.clone());
                    values.push(unfinished.item.clone());
                }
                let by = (&stopper.host, as_i64(u64::from(stopper.pid)), as_i64(stopper.start));
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                // Items this process holds come back pending, their attempts counted up (saturating:
                // a row with attempts at the top of `integer` must not fail the stop).
                let handed_back = tx
                    .execute(
                        "UPDATE planned_stop_items AS i SET participant = n.participant, item = n.item, \
                         stopped_by_host = $4, stopped_by_pid = $5, stopped_by_start = $6, stopped_at = $7, \
                         attempts = LEAST(GREATEST(i.attempts, 0), 2147483646) + 1, lease_owner = NULL, \
                         lease_host = NULL, lease_pid = NULL, lease_start = NULL, leased_at = NULL, \
                         lease_expires = NULL \
                         FROM unnest($2::text[], $3::text[], $9::jsonb[]) AS n(id, participant, item) \
                         WHERE i.service = $1 AND i.id = n.id AND i.lease_owner = $8 AND i.quarantined IS NULL",
                        &[&service, &back, &back_participants, by.0, &by.1, &by.2, &record.finished_at, &owner_key(&stopper), &back_values],
                    )
                    .await
                    .map_err(|e| backend("hand items back", e))?;
                // New items: written once.
                let inserted = tx
                    .execute(
                        "INSERT INTO planned_stop_items (service, id, participant, item, stopped_by_host, \
                         stopped_by_pid, stopped_by_start, stopped_at, attempts) \
                         SELECT $1, n.id, n.participant, n.item, $4, $5, $6, $7, 1 \
                         FROM unnest($2::text[], $3::text[], $8::jsonb[]) AS n(id, participant, item) \
                         ON CONFLICT DO NOTHING",
                        &[&service, &ids, &participants, by.0, &by.1, &by.2, &record.finished_at, &values],
                    )
                    .await
                    .map_err(|e| backend("insert the items", e))?;
                let left_alone = (back.len() as u64).saturating_sub(handed_back)
                    + (ids.len() as u64).saturating_sub(inserted);
                if left_alone > 0 {
                    tracing::warn!(left_alone, "items handed back that are not this process's any \
                        more (acknowledged, dropped or released by an operator, or taken over), or \
                        new items whose id was taken; left as they are");
                }
                let summary = serde_json::to_value(&record).map_err(|e| backend("encode the stop record", e))?;
                tx.execute(
                    "INSERT INTO planned_stop_stops (service, record, written_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (service) DO UPDATE SET record = EXCLUDED.record, written_at = EXCLUDED.written_at",
                    &[&service, &summary, &record.finished_at],
                )
                .await
                .map_err(|e| backend("write the stop record", e))?;
                tx.commit().await.map_err(|e| backend("commit the stop record", e))
            })
        })
        .await
    }

    /// Pushes what a stop spilled on this host to the database: each item once (an item already
    /// acknowledged in the database is not brought back), then removes it from the spill.
    async fn push_spilled(&self) -> Result<(), RecordError> {
        let Some(spill) = &self.spill else {
            return Ok(());
        };
        let spilled = spill.list().await?;
        if spilled.is_empty() {
            return Ok(());
        }
        let service = self.service.clone();
        let items: Vec<ResumeItem> = spilled.iter().map(|s| s.item.clone()).collect();
        let summary = spill.last_stop().await.ok().flatten();
        self.run(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                for item in &items {
                    // A new item is inserted unless it was acknowledged or dropped meanwhile; an
                    // item the spilling process had leased from the database replaces the stale
                    // row (newer content, attempts counted up, pending) while that process still
                    // holds it there, and is left to whoever holds it otherwise.
                    tx.execute(
                        "INSERT INTO planned_stop_items (service, id, participant, item, stopped_by_host, \
                         stopped_by_pid, stopped_by_start, stopped_at, attempts) \
                         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 WHERE NOT EXISTS \
                         (SELECT 1 FROM planned_stop_acks WHERE service = $1 AND id = $2) \
                         ON CONFLICT (service, id) DO UPDATE SET participant = EXCLUDED.participant, \
                         item = EXCLUDED.item, stopped_by_host = EXCLUDED.stopped_by_host, \
                         stopped_by_pid = EXCLUDED.stopped_by_pid, stopped_by_start = EXCLUDED.stopped_by_start, \
                         stopped_at = EXCLUDED.stopped_at, \
                         attempts = LEAST(GREATEST(planned_stop_items.attempts, 0), 2147483646) + 1, \
                         lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_start = NULL, \
                         leased_at = NULL, lease_expires = NULL \
                         WHERE planned_stop_items.lease_owner = $10 AND planned_stop_items.quarantined IS NULL",
                        &[
                            &service,
                            &item.id,
                            &item.participant,
                            &item.item,
                            &item.stopped_by.host,
                            &as_i64(u64::from(item.stopped_by.pid)),
                            &as_i64(item.stopped_by.start),
                            &item.stopped_at,
                            &i32::try_from(item.attempts).unwrap_or(i32::MAX),
                            &owner_key(&item.stopped_by),
                        ],
                    )
                    .await
                    .map_err(|e| backend("push a spilled item", e))?;
                }
                if let Some(summary) = &summary {
                    let record = serde_json::to_value(summary).map_err(|e| backend("encode", e))?;
                    tx.execute(
                        "INSERT INTO planned_stop_stops (service, record, written_at) VALUES ($1, $2, $3) \
                         ON CONFLICT (service) DO UPDATE SET record = EXCLUDED.record, written_at = EXCLUDED.written_at \
                         WHERE planned_stop_stops.written_at < EXCLUDED.written_at",
                        &[&service, &record, &summary.finished_at],
                    )
                    .await
                    .map_err(|e| backend("push the spilled stop record", e))?;
                }
                tx.commit().await.map_err(|e| backend("commit the spilled items", e))
            })
        })
        .await?;
        for state in &spilled {
            spill.remove(&state.item.id).await?;
        }
        tracing::info!(
            items = spilled.len(),
            "pushed the items a stop had spilled on this host to PostgreSQL"
        );
        Ok(())
    }

    async fn lease_db(
        &self,
        owner: &Owner,
        max: usize,
        lease_for: Duration,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Leased>, RecordError> {
        let expires_at = lease_end(now, lease_for);
        let service = self.service.clone();
        let owner = owner.clone();
        let liveness = self.liveness.clone();
        self.run(move |client| {
            Box::pin(async move {
                // Owners on this host can be looked up: the dead ones' items are on offer now.
                let holders = client
                    .query(
                        "SELECT DISTINCT lease_host, lease_pid, lease_start, lease_owner FROM planned_stop_items \
                         WHERE service = $1 AND lease_owner IS NOT NULL AND quarantined IS NULL",
                        &[&service],
                    )
                    .await
                    .map_err(|e| backend("list the lease holders", e))?;
                let mut seen: HashMap<String, Liveness> = HashMap::new();
                for row in &holders {
                    // A holder with a missing part is not looked up: its row is examined (and
                    // quarantined) below.
                    let mut problems = Vec::new();
                    let host: String = col(row, "lease_host", &mut problems);
                    let pid: i64 = col(row, "lease_pid", &mut problems);
                    let start: i64 = col(row, "lease_start", &mut problems);
                    let key: String = col(row, "lease_owner", &mut problems);
                    let pid = pid_of(pid, "lease_pid", &mut problems);
                    if problems.is_empty() {
                        seen.insert(key, liveness(&Owner::new(host, pid, start as u64)));
                    }
                }
                let dead: Vec<String> = seen
                    .iter()
                    .filter(|(_, l)| **l == Liveness::Dead)
                    .map(|(k, _)| k.clone())
                    .collect();
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                // A start leases: the name is registered, so `records list` knows it from now on.
                tx.execute(
                    "INSERT INTO planned_stop_services (service, first_seen, last_seen) \
                     VALUES ($1, $2, $2) ON CONFLICT (service) DO UPDATE SET last_seen = $2",
                    &[&service, &now],
                )
                .await
                .map_err(|e| backend("register the service", e))?;
                let mut examined: Vec<String> = Vec::new();
                let mut leased = Vec::new();
                let limit = i64::try_from(max).unwrap_or(i64::MAX);
                loop {
                    let want = limit - leased.len() as i64;
                    if want <= 0 {
                        break;
                    }
                    let rows = tx
                        .query(
                            &format!(
                                "SELECT {COLUMNS} FROM planned_stop_items WHERE service = $1 AND quarantined IS NULL \
                                 AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= $2 \
                                 OR lease_owner = ANY($3)) \
                                 AND NOT (id = ANY($4)) ORDER BY stopped_at, id LIMIT $5 FOR UPDATE SKIP LOCKED"
                            ),
                            &[&service, &now, &dead, &examined, &want],
                        )
                        .await
                        .map_err(|e| backend("find items on offer", e))?;
                    if rows.is_empty() {
                        break;
                    }
                    let mut taken = Vec::new();
                    for row in &rows {
                        let (state, problem) = item_of(row);
                        examined.push(state.item.id.clone());
                        if let Some(reason) = problem {
                            quarantine(&tx, &service, &state.item.id, &reason).await?;
                            continue;
                        }
                        let holder = state
                            .lease
                            .as_ref()
                            .map_or(Liveness::Dead, |l| *seen.get(&owner_key(&l.owner)).unwrap_or(&Liveness::Unknown));
                        if lease::is_offered(state.lease.as_ref(), now, holder) {
                            taken.push(state.item);
                        }
                    }
                    if taken.is_empty() {
                        continue;
                    }
                    let ids: Vec<&str> = taken.iter().map(|i| i.id.as_str()).collect();
                    tx.execute(
                        "UPDATE planned_stop_items SET lease_owner = $3, lease_host = $4, lease_pid = $5, \
                         lease_start = $6, leased_at = $7, lease_expires = $8 WHERE service = $1 AND id = ANY($2)",
                        &[
                            &service,
                            &ids,
                            &owner_key(&owner),
                            &owner.host,
                            &as_i64(u64::from(owner.pid)),
                            &as_i64(owner.start),
                            &now,
                            &expires_at,
                        ],
                    )
                    .await
                    .map_err(|e| backend("lease the items", e))?;
                    leased.extend(taken.into_iter().map(|item| Leased {
                        item,
                        lease: Lease::new(owner.clone(), now, expires_at),
                    }));
                }
                tx.commit().await.map_err(|e| backend("commit the leases", e))?;
                // Oldest first across batches (a later batch can only hold later items).
                Ok(leased)
            })
        })
        .await
    }

    /// A lease call failed, perhaps after the server committed it (the commit outlasted the
    /// operation timeout): the caller got nothing, so nothing it might have been given may stay
    /// leased to this live process. Releases, in the background until it succeeds (at most a few
    /// minutes), every item leased to `owner` by that call (`leased_at` = `stamp`).
    fn release_uncertain(&self, owner: &Owner, stamp: chrono::DateTime<chrono::Utc>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key) = (self.clone(), owner_key(owner));
        let abandoned = self
            .backends
            .lock()
            .ok()
            .and_then(|mut b| b.abandoned.take());
        runtime.spawn(async move {
            let mut wait = Duration::from_millis(100);
            for _ in 0..20 {
                let (service, key) = (store.service.clone(), key.clone());
                let released = store
                    .run(move |client| {
                        Box::pin(async move {
                            // The abandoned call may still be committing on the server: end it
                            // and wait until its server process is gone, so what it did is final
                            // (committed or rolled back) before the release looks.
                            if let Some(pid) = abandoned {
                                let _ = client.execute("SELECT pg_terminate_backend($1)", &[&pid]).await;
                                let gone = client
                                    .query_one(
                                        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                                        &[&pid],
                                    )
                                    .await
                                    .map_err(|e| backend("look for the abandoned call", e))?
                                    .try_get::<_, bool>(0)
                                    .unwrap_or(false);
                                if !gone {
                                    return Err(RecordError::backend(
                                        "the abandoned call is still running in PostgreSQL",
                                    ));
                                }
                            }
                            client
                                .execute(
                                    "UPDATE planned_stop_items SET lease_owner = NULL, lease_host = NULL, \
                                     lease_pid = NULL, lease_start = NULL, leased_at = NULL, lease_expires = NULL \
                                     WHERE service = $1 AND lease_owner = $2 AND leased_at = $3",
                                    &[&service, &key, &stamp],
                                )
                                .await
                                .map_err(|e| backend("release what a failed lease took", e))
                        })
                    })
                    .await;
                match released {
                    Ok(n) => {
                        if n > 0 {
                            tracing::warn!(items = n, "a lease call failed after the database \
                                had taken items for it; they are pending again");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %crate::error_chain::ErrorChain(&e),
                            "cannot release what a failed lease may have taken yet; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(10));
                    }
                }
            }
            tracing::error!("could not release what a failed lease call may have taken: such \
                items stay leased to this process until it exits; `planned-stop records release` \
                frees them");
        });
    }

    async fn acknowledge_db(&self, owner: &Owner, id: &str) -> Result<(), RecordError> {
        let service = self.service.clone();
        let owner = owner_key(owner);
        let id = id.to_owned();
        let now = self.clock.now();
        self.run(move |client| {
            Box::pin(async move {
                // One statement: the item goes and its acknowledgement comes, only if it is ours.
                let done = client
                    .query_opt(
                        "WITH gone AS (DELETE FROM planned_stop_items WHERE service = $1 AND id = $2 \
                         AND lease_owner = $3 RETURNING id) \
                         INSERT INTO planned_stop_acks (service, id, acked_by, acked_at) \
                         SELECT $1, id, $3, $4 FROM gone RETURNING id",
                        &[&service, &id, &owner, &now],
                    )
                    .await
                    .map_err(|e| backend("acknowledge an item", e))?;
                if done.is_some() {
                    return Ok(());
                }
                let row = client
                    .query_opt(
                        "SELECT lease_owner FROM planned_stop_items WHERE service = $1 AND id = $2",
                        &[&service, &id],
                    )
                    .await
                    .map_err(|e| backend("read an item", e))?;
                match row {
                    None => Err(RecordError::UnknownItem { id }),
                    Some(row) => Err(RecordError::NotHolder {
                        id,
                        holder: row.try_get::<_, Option<String>>(0).ok().flatten(),
                    }),
                }
            })
        })
        .await
    }

    async fn release_db(&self, owner: Option<&Owner>, id: &str) -> Result<bool, RecordError> {
        let service = self.service.clone();
        let owner = owner.map(owner_key);
        let id = id.to_owned();
        self.run(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                let row = tx
                    .query_opt(
                        "SELECT lease_owner FROM planned_stop_items WHERE service = $1 AND id = $2 FOR UPDATE",
                        &[&service, &id],
                    )
                    .await
                    .map_err(|e| backend("read an item", e))?;
                let Some(row) = row else {
                    return Err(RecordError::UnknownItem { id });
                };
                let holder: Option<String> = row
                    .try_get(0)
                    .map_err(|e| backend("an item row does not fit this schema", e))?;
                let Some(holder) = holder else {
                    return Ok(false);
                };
                if let Some(owner) = owner
                    && owner != holder
                {
                    return Err(RecordError::NotHolder { id, holder: Some(holder) });
                }
                tx.execute(
                    "UPDATE planned_stop_items SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL, \
                     lease_start = NULL, leased_at = NULL, lease_expires = NULL WHERE service = $1 AND id = $2",
                    &[&service, &id],
                )
                .await
                .map_err(|e| backend("release an item", e))?;
                tx.commit().await.map_err(|e| backend("commit the release", e))?;
                Ok(true)
            })
        })
        .await
    }
}

impl RecordStore for PgRecordStore {
    fn persist<'a>(
        &'a self,
        stopper: &'a Owner,
        record: &'a StopRecord,
    ) -> RecordFuture<'a, Persisted> {
        Box::pin(async move {
            match self.persist_db(stopper, record).await {
                Ok(()) => Ok(Persisted::Durable),
                Err(e @ RecordError::Backend { .. }) => match &self.spill {
                    Some(spill) => {
                        tracing::warn!(error = %crate::error_chain::ErrorChain(&e), dir = %spill.dir().display(),
                            "PostgreSQL is unreachable at the stop: the items are kept on this host and pushed at the next start");
                        // The spill keeps every item as this host's own: the lease of a handed-back
                        // item is in the database, and the push decides there (see push_spilled).
                        let mut own = record.clone();
                        for item in &mut own.unfinished {
                            item.resumed = false;
                        }
                        spill.persist(stopper, &own).await?;
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
                tracing::warn!(error = %crate::error_chain::ErrorChain(&e), "cannot push the spilled items yet; they stay on this host");
            }
            // Each call's leases carry its own `leased_at`: what a failed call may have taken
            // (a commit that outlasted the timeout) can be named and released.
            let now = self.clock.now();
            let leased = self.lease_db(owner, max, lease_for, now).await;
            if leased.is_err() {
                self.release_uncertain(owner, now);
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
        let now = self.clock.now();
        let expires_at = lease_end(now, lease_for);
        Box::pin(self.run(move |client| {
            Box::pin(async move {
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

    fn release<'a>(&'a self, owner: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool> {
        Box::pin(self.release_db(owner, id))
    }

    fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool> {
        let service = self.service.clone();
        let id = id.to_owned();
        let now = self.clock.now();
        Box::pin(self.run(move |client| {
            Box::pin(async move {
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
