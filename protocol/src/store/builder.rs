//! Opening a [`MarkerStore`] with options; the defaults are the safe ones.

use super::files::prepare_dir;
use super::{Layout, MarkerStore, StoreError};
use crate::judgement::Policy;
use std::path::PathBuf;

/// Opens a [`MarkerStore`] with options. Safe defaults: [`Policy::default`], private directory.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// let store = planned_stop_protocol::marker::MarkerStore::builder(planned_stop_protocol::Layout::Slots(dir.path().join("run")))
///     .allow_shared_dir(false)
///     .open()
///     .unwrap();
/// assert!(store.dir().is_dir());
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct MarkerStoreBuilder {
    pub(super) layout: Layout,
    pub(super) policy: Policy,
    pub(super) allow_shared_dir: bool,
    pub(super) create_dir: bool,
}

impl MarkerStoreBuilder {
    /// Sets the policy used for every judgement this store reaches.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let policy = planned_stop_protocol::marker::Policy::default().with_future_skew(std::time::Duration::from_secs(30));
    /// let store = planned_stop_protocol::marker::MarkerStore::builder(planned_stop_protocol::Layout::Slots(dir.path().into())).policy(policy).open().unwrap();
    /// assert_eq!(store.policy().future_skew.as_secs(), 30);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Accepts a marker directory that group or others can write (default `false`). Only do this
    /// when everyone who can write there is trusted to stop the service.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop_protocol::marker::MarkerStore::builder(planned_stop_protocol::Layout::Slots(dir.path().into())).allow_shared_dir(true).open();
    /// assert!(store.is_ok());
    /// ```
    pub fn allow_shared_dir(mut self, allow: bool) -> Self {
        self.allow_shared_dir = allow;
        self
    }

    /// Whether [`MarkerStoreBuilder::open`] creates a missing directory (default `true`). A reader
    /// that must change nothing (`planned-stop inspect`) passes `false`: a missing directory then
    /// simply holds no markers.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let missing = dir.path().join("not-yet");
    /// let store = planned_stop_protocol::marker::MarkerStore::builder(planned_stop_protocol::Layout::Slots(missing.clone())).create_dir(false).open().unwrap();
    /// assert!(!missing.exists());
    /// assert_eq!(store.inspect(1, chrono::Utc::now()), Ok(planned_stop_protocol::marker::Judgement::Absent));
    /// ```
    pub fn create_dir(mut self, create: bool) -> Self {
        self.create_dir = create;
        self
    }

    /// Creates the directory if missing (mode 0700) and checks its permissions.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop_protocol::marker::MarkerStore::builder(planned_stop_protocol::Layout::Slots(dir.path().join("a/b"))).open().unwrap();
    /// assert!(store.dir().is_dir());
    /// ```
    pub fn open(self) -> Result<MarkerStore, StoreError> {
        let dir = match &self.layout {
            Layout::Slots(dir) => dir.clone(),
            Layout::SingleFile(file) => match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
        };
        if self.create_dir || dir.exists() {
            prepare_dir(&dir, self.allow_shared_dir)?;
        }
        Ok(MarkerStore {
            layout: self.layout,
            dir,
            policy: self.policy,
            allow_shared_dir: self.allow_shared_dir,
            reported_dirs: Default::default(),
            users_seen: Default::default(),
        })
    }
}
