//! What `tests/web.rs` and its helper program `tests/helpers/web_app.rs` share: the ways an
//! application's `main` is written (the test names one, the program runs its `main` that way) and
//! the typed item the program's work participant hands back.

#![allow(dead_code)] // each side uses its part

/// The ways an application's `main` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppLayout {
    /// `System::new()`, the server spawned, `run_with_code`, exit with that code.
    RunWithCode,
    /// `#[actix::main]`: the server spawned, `main` returns `service.stopped().await`.
    ActixMain,
    /// `#[actix_web::main]`: `main` returns `planned_stop::web::serve(server, ..).await`.
    ActixWebMain,
    /// The application runs an `HttpServer` of its own with actix-server's signal handling left
    /// on (not handed to `serve`), under `run_with_code`.
    OwnServerWithSignals,
    /// `#[actix_web::main]` running the application's own `HttpServer` with `server.run().await`
    /// (the integration not used, actix-web's signal handling left on); `main` returns `Ok(())`.
    OwnServerBlockOn,
    /// `planned_stop::web::serve(server, &stop).await?; Ok(())` in `main -> io::Result<()>`:
    /// the exit code the future resolves to is dropped.
    ServeThenOk,
    /// `main` awaits `serve`, then panics.
    PanicsAfterStop,
    /// A mistake: `#[actix::main]` whose `main` returns without awaiting the runner.
    ActixMainReturnsEarly,
    /// `main` panics right after starting the service.
    PanicsAtOnce,
    /// `#[actix_web::main] async fn main() -> io::Result<()>` returns its own error
    /// (`AddrInUse`) right after starting the service.
    ErrAfterStart,
    /// The runner does not own the process's end (`owns_process_exit(false)`) and `main` runs
    /// a server that never ends: the stop finishes, the process stays.
    NotOwnedNeverEnds,
}

/// The layouts of the table in docs/design.md: every stop ends with its verdict's code.
pub const LAYOUTS: [AppLayout; 7] = [
    AppLayout::RunWithCode,
    AppLayout::ActixMain,
    AppLayout::ActixWebMain,
    AppLayout::OwnServerWithSignals,
    AppLayout::OwnServerBlockOn,
    AppLayout::ServeThenOk,
    AppLayout::PanicsAfterStop,
];

impl AppLayout {
    pub fn role(self) -> &'static str {
        match self {
            AppLayout::RunWithCode => "run-with-code",
            AppLayout::ActixMain => "actix-main",
            AppLayout::ActixWebMain => "actix-web-main",
            AppLayout::OwnServerWithSignals => "own-server-with-signals",
            AppLayout::OwnServerBlockOn => "own-server-block-on",
            AppLayout::ServeThenOk => "serve-then-ok",
            AppLayout::PanicsAfterStop => "panics-after-stop",
            AppLayout::ActixMainReturnsEarly => "actix-main-returns-early",
            AppLayout::PanicsAtOnce => "panics-at-once",
            AppLayout::ErrAfterStart => "err-after-start",
            AppLayout::NotOwnedNeverEnds => "not-owned-never-ends",
        }
    }

    pub fn of_role(role: &str) -> Option<AppLayout> {
        LAYOUTS
            .into_iter()
            .chain([
                AppLayout::ActixMainReturnsEarly,
                AppLayout::PanicsAtOnce,
                AppLayout::ErrAfterStart,
                AppLayout::NotOwnedNeverEnds,
            ])
            .find(|l| l.role() == role)
    }
}

/// A typed resume item.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Job {
    pub name: String,
}
