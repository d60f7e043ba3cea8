//! libpq's environment: a connection string completed by `PGHOST`, `PGPORT` and the rest, as
//! `psql` would complete it, so an operator's usual settings reach the store.

use super::backend;
use planned_stop::record::RecordError;
use std::time::Duration;
use tokio_postgres::Config;

/// A connection string with libpq's environment defaults filled in: `PGHOST`, `PGPORT`, `PGUSER`,
/// `PGPASSWORD`, `PGDATABASE`, `PGAPPNAME` and `PGCONNECT_TIMEOUT` supply what `url` leaves out (an
/// empty `url` takes everything from the environment).
///
/// ```
/// let config = planned_stop_postgres::pg_config("postgres://app@db.internal:6432/jobs").unwrap();
/// assert_eq!(config.get_dbname(), Some("jobs"));
/// assert!(planned_stop_postgres::pg_config("postgres://[::1").is_err());
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
