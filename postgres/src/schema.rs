//! The schema this crate creates and versions itself, at the first connection of any replica:
//! one transaction under an advisory lock, so replicas starting together migrate once.

use super::backend;
use planned_stop::record::RecordError;
use tokio_postgres::Client;

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 6;

pub(super) const MIGRATIONS: [&str; 6] = [
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
    // 4: failed attempts are counted, so an item that keeps failing is held aside for a person
    // (its reason in `quarantined`) rather than offered forever.
    "ALTER TABLE planned_stop_items ADD COLUMN failures integer NOT NULL DEFAULT 0,
        ADD COLUMN last_failure text;",
    // 5: half of each page left free, so a lease, which rewrites every row it takes, writes the
    // new version beside the old one without touching the indexes (a HOT update): leasing
    // 100,000 items took 1.6 s of index writes on full pages, 0.4 s with room. Rows written
    // before keep their full pages.
    "ALTER TABLE planned_stop_items SET (fillfactor = 50);",
    // 6: two thirds free, since the new version carries the lease (about 70 bytes more than the
    // row it replaces): at half free, a third of the rows leased still went to other pages, with
    // their index writes (the update of 100,000 leases: 1.4-1.6 s, at two thirds 0.3-0.4 s).
    "ALTER TABLE planned_stop_items SET (fillfactor = 35);",
];

/// Creates or upgrades the schema, once per database whatever the number of replicas starting.
pub(super) async fn migrate(client: &mut Client) -> Result<(), RecordError> {
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
