//! The marker: the one small JSON document a stopper leaves for its target.
//!
//! A marker says "process `target_pid`, started at `target_start_time`, stop now, on purpose". It is
//! the only thing that crosses the trust boundary between a stopper and a running service, and the
//! directory it lives in may be shared, so this module treats every byte as hostile:
//!
//! - the input is bounded ([`MAX_MARKER_BYTES`]) and nested at most `MAX_NESTING` levels deep, so a
//!   1 MiB file or a thousand nested arrays cost nothing;
//! - integers must be JSON integers in range: `true` is not pid 1, `12.0` is not pid 12 and `1e999`
//!   is an error, not a panic (hazard 6 in docs/protocol.md);
//! - timestamps must carry an offset (`Z` or `+00:00`), because a naive time read in another time
//!   zone would shift a marker's age by hours;
//! - a key given twice is refused: two parsers that keep different copies must never disagree.
//!
//! Keys this version does not know are ignored, so a v1 reader accepts what a later v1 writer adds.
//! The module is pure: no file system, no clock, no process table. Whether a marker is *for us* is the
//! job of [`crate::judgement`].

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The only protocol version this crate reads and writes.
pub(crate) const MARKER_VERSION: u64 = 1;

/// Largest marker accepted, in bytes (a UTF-8 byte-order mark included).
pub const MAX_MARKER_BYTES: usize = 4096;

/// Deepest nesting of arrays and objects accepted; the marker itself is depth 1.
pub(crate) const MAX_NESTING: usize = 8;

/// Longest `request_id`, in characters.
pub const MAX_REQUEST_ID_CHARS: usize = 64;

/// Longest `reason`, in characters.
pub const MAX_REASON_CHARS: usize = 256;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A planned-stop request, schema v1.
///
/// Build one with [`Marker::new`] and the `with_*` methods, turn it into bytes with
/// [`Marker::to_json`], and read bytes back with [`Marker::parse`]:
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use planned_stop_protocol::marker::Marker;
///
/// let written_at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
/// let marker = Marker::new(4242, Some(987_654), written_at).with_reason("deploy 1.4.2");
/// let bytes = marker.to_json().unwrap();
/// assert_eq!(Marker::parse(&bytes).unwrap(), marker);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Marker {
    /// The process that must stop.
    pub target_pid: u32,
    /// The target's start fingerprint, as [`crate::ProcessIdentity::of`] read it, or `None` when the
    /// stopper could not read it. Every marker, with a fingerprint or without, fires only when it
    /// was written no earlier than the start slack (2 s by default) before the target started;
    /// for one without a fingerprint that rule is all that tells it from a dead predecessor's (see
    /// `docs/protocol.md`).
    pub target_start_time: Option<u64>,
    /// The process that wrote the marker, for the record.
    pub stopper_pid: Option<u32>,
    /// When the marker was written; markers expire after the policy's TTL.
    pub written_at: DateTime<Utc>,
    /// An identifier the stopper chose, echoed in the acknowledgement and the stop record.
    pub request_id: Option<String>,
    /// Free text for logs and the stop record.
    pub reason: Option<String>,
    /// `false` asks the watcher to leave the marker alone: it only classifies a signal that follows as
    /// planned (the systemd `ExecStop` case, where systemd itself sends the SIGTERM).
    pub trigger_watcher: bool,
    /// What the stopper asks for: a stop that stays down (the default), or a planned restart.
    pub action: StopAction,
    /// A drain deadline for this request (`"drain_deadline_ms"`), when the stopper wants the
    /// drain shorter than the service's own: the service drains within the shorter of the two
    /// (pg_ctl's "fast" next to its "smart"). `None`: the service's own deadline. A reader of an
    /// earlier version ignores the field and drains within its own.
    pub drain_deadline: Option<std::time::Duration>,
}

/// What a marker asks the target to do. Both drain and record alike; they differ in the exit code,
/// so a supervisor brings a restarted service back while a stopped one stays down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopAction {
    /// Stop and stay down: the planned exit code (0 by default). `"action"` absent or `"stop"`.
    #[default]
    Stop,
    /// Stop so that the supervisor starts the service again: the restart exit code (75,
    /// `EX_TEMPFAIL`, by default). `"action": "restart"`.
    Restart,
}

impl Marker {
    /// A marker for `target_pid` (with its start fingerprint, when known) written at `written_at`,
    /// with no request id, no reason, no stopper pid and `trigger_watcher: true`.
    ///
    /// ```
    /// let m = planned_stop_protocol::marker::Marker::new(42, None, chrono::Utc::now());
    /// assert!(m.trigger_watcher && m.reason.is_none());
    /// ```
    #[must_use]
    pub fn new(target_pid: u32, target_start_time: Option<u64>, written_at: DateTime<Utc>) -> Self {
        Marker {
            target_pid,
            target_start_time,
            stopper_pid: None,
            written_at,
            request_id: None,
            reason: None,
            trigger_watcher: true,
            action: StopAction::Stop,
            drain_deadline: None,
        }
    }

    /// Asks for a drain within `deadline` (or the service's own deadline, if shorter).
    ///
    /// ```
    /// use planned_stop_protocol::marker::Marker;
    /// use std::time::Duration;
    /// let m = Marker::new(42, None, chrono::Utc::now()).with_drain_deadline(Duration::from_millis(1500));
    /// let json = String::from_utf8(m.to_json().unwrap()).unwrap();
    /// assert!(json.contains("\"drain_deadline_ms\":1500"));
    /// assert_eq!(Marker::parse(json.as_bytes()).unwrap().drain_deadline, Some(Duration::from_millis(1500)));
    /// ```
    #[must_use]
    pub fn with_drain_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.drain_deadline = Some(deadline);
        self
    }

    /// Asks for `action` (see [`StopAction`]).
    ///
    /// ```
    /// use planned_stop_protocol::marker::{Marker, StopAction};
    /// let m = Marker::new(42, None, chrono::Utc::now()).with_action(StopAction::Restart);
    /// let json = String::from_utf8(m.to_json().unwrap()).unwrap();
    /// assert!(json.contains("\"action\":\"restart\""));
    /// assert_eq!(Marker::parse(json.as_bytes()).unwrap().action, StopAction::Restart);
    /// ```
    #[must_use]
    pub fn with_action(mut self, action: StopAction) -> Self {
        self.action = action;
        self
    }

    /// Sets the pid of the process writing the marker.
    ///
    /// ```
    /// let m = planned_stop_protocol::marker::Marker::new(42, None, chrono::Utc::now()).with_stopper_pid(7);
    /// assert_eq!(m.stopper_pid, Some(7));
    /// ```
    #[must_use]
    pub fn with_stopper_pid(mut self, pid: u32) -> Self {
        self.stopper_pid = Some(pid);
        self
    }

    /// Sets the request id (at most 64 characters, checked by [`Marker::to_json`]).
    ///
    /// ```
    /// let m = planned_stop_protocol::marker::Marker::new(42, None, chrono::Utc::now()).with_request_id("x".repeat(65));
    /// assert!(m.to_json().is_err(), "too long");
    /// ```
    #[must_use]
    pub fn with_request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Sets the reason (at most 256 characters, checked by [`Marker::to_json`]).
    ///
    /// ```
    /// let m = planned_stop_protocol::marker::Marker::new(42, None, chrono::Utc::now()).with_reason("deploy");
    /// assert_eq!(m.reason.as_deref(), Some("deploy"));
    /// ```
    #[must_use]
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets `trigger_watcher` (see the field).
    ///
    /// ```
    /// let m = planned_stop_protocol::marker::Marker::new(42, None, chrono::Utc::now()).with_trigger_watcher(false);
    /// assert!(String::from_utf8(m.to_json().unwrap()).unwrap().contains("\"trigger_watcher\":false"));
    /// ```
    #[must_use]
    pub fn with_trigger_watcher(mut self, trigger: bool) -> Self {
        self.trigger_watcher = trigger;
        self
    }

    /// Serialises the marker as compact JSON, after checking it is one [`Marker::parse`] accepts, so a
    /// writer can never leave a marker its reader would throw away.
    ///
    /// ```
    /// let bytes = planned_stop_protocol::marker::Marker::new(42, Some(9), chrono::Utc::now()).to_json().unwrap();
    /// assert!(bytes.starts_with(b"{\"version\":1,\"target_pid\":42"));
    /// ```
    pub fn to_json(&self) -> Result<Vec<u8>, MarkerError> {
        self.check_fields()?;
        let bytes = serde_json::to_vec(&Wire::from(self))
            .map_err(|e| MarkerError::Syntax(e.to_string()))?;
        if bytes.len() > MAX_MARKER_BYTES {
            return Err(MarkerError::TooLarge { len: bytes.len() });
        }
        Ok(bytes)
    }

    /// Parses a marker from raw file contents: strict, bounded, never panics.
    ///
    /// Accepts an optional UTF-8 byte-order mark. Every rule the module documentation lists is
    /// enforced here, and the error names the first one broken.
    ///
    /// ```
    /// use planned_stop_protocol::marker::{Marker, MarkerError};
    /// assert!(matches!(Marker::parse(br#"{"target_pid":true}"#), Err(MarkerError::InvalidField { field: "target_pid", .. })));
    /// let m = Marker::parse(br#"{"target_pid":5,"written_at":"2026-11-30T12:00:00Z"}"#).unwrap();
    /// assert_eq!(m.target_start_time, None);
    /// ```
    pub fn parse(bytes: &[u8]) -> Result<Marker, MarkerError> {
        if bytes.len() > MAX_MARKER_BYTES {
            return Err(MarkerError::TooLarge { len: bytes.len() });
        }
        let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
        let text = std::str::from_utf8(bytes).map_err(|e| MarkerError::NotUtf8 {
            offset: e.valid_up_to(),
        })?;
        if text.trim().is_empty() {
            return Err(MarkerError::Empty);
        }
        check_nesting(text.as_bytes())?;
        let fields: Fields = serde_json::from_str(text).map_err(|e| {
            if e.is_data() {
                MarkerError::NotAnObject
            } else {
                MarkerError::Syntax(e.to_string())
            }
        })?;
        Marker::from_fields(fields.0)
    }

    fn from_fields(fields: Vec<(String, Value)>) -> Result<Marker, MarkerError> {
        for (i, (key, _)) in fields.iter().enumerate() {
            if fields[..i].iter().any(|(earlier, _)| earlier == key) {
                return Err(MarkerError::DuplicateKey(key.clone()));
            }
        }
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);

        if let Some(v) = get("version") {
            match v.as_u64() {
                Some(MARKER_VERSION) => {}
                _ => return Err(MarkerError::UnsupportedVersion(v.to_string())),
            }
        }
        let target_pid = match get("target_pid") {
            None => return Err(MarkerError::MissingField("target_pid")),
            Some(v) => pid_field("target_pid", v)?,
        };
        let target_start_time = match get("target_start_time") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| MarkerError::InvalidField {
                field: "target_start_time",
                reason: format!("must be a non-negative integer or null, found {}", brief(v)),
            })?),
        };
        let stopper_pid = match get("stopper_pid") {
            None | Some(Value::Null) => None,
            Some(v) => Some(pid_field("stopper_pid", v)?),
        };
        let written_at = match get("written_at") {
            None => return Err(MarkerError::MissingField("written_at")),
            Some(Value::String(s)) => parse_time(s)?,
            Some(v) => {
                return Err(MarkerError::InvalidField {
                    field: "written_at",
                    reason: format!("must be an RFC 3339 string, found {}", brief(v)),
                });
            }
        };
        let request_id = text_field("request_id", get("request_id"))?;
        let reason = text_field("reason", get("reason"))?;
        let trigger_watcher = match get("trigger_watcher") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(MarkerError::InvalidField {
                    field: "trigger_watcher",
                    reason: format!("must be true or false, found {}", brief(v)),
                });
            }
        };
        let marker = Marker {
            target_pid,
            target_start_time,
            stopper_pid,
            written_at,
            request_id,
            reason,
            trigger_watcher,
            action: action_field(get("action"))?,
            drain_deadline: drain_deadline_field(get("drain_deadline_ms"))?,
        };
        marker.check_fields()?;
        Ok(marker)
    }

    /// The rules a value must keep whichever way it was made (parsed or built).
    fn check_fields(&self) -> Result<(), MarkerError> {
        if self.target_pid == 0 {
            return Err(out_of_range("target_pid", 0));
        }
        if self.stopper_pid == Some(0) {
            return Err(out_of_range("stopper_pid", 0));
        }
        check_text(
            "request_id",
            self.request_id.as_deref(),
            MAX_REQUEST_ID_CHARS,
        )?;
        check_text("reason", self.reason.as_deref(), MAX_REASON_CHARS)
    }
}

/// Why bytes are not a valid v1 marker. Each variant names one rule.
///
/// ```
/// use planned_stop_protocol::marker::{Marker, MarkerError};
/// let err = Marker::parse(br#"{"target_pid":1,"target_pid":2}"#).unwrap_err();
/// assert_eq!(err, MarkerError::DuplicateKey("target_pid".into()));
/// assert_eq!(err.to_string(), "key `target_pid` appears more than once");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MarkerError {
    /// More than 4,096 bytes.
    #[error("marker is {len} bytes, more than the {MAX_MARKER_BYTES} allowed")]
    TooLarge {
        /// Bytes seen (the reader stops at one past the limit).
        len: usize,
    },
    /// Not valid UTF-8.
    #[error("marker is not valid UTF-8 (first bad byte at offset {offset})")]
    NotUtf8 {
        /// Offset of the first byte that is not UTF-8.
        offset: usize,
    },
    /// Nothing but white space.
    #[error("marker file is empty")]
    Empty,
    /// Arrays or objects nested deeper than 8 levels.
    #[error("marker nests deeper than {MAX_NESTING} levels")]
    TooDeep,
    /// Not JSON at all (the message is the JSON parser's).
    #[error("marker is not valid JSON: {0}")]
    Syntax(String),
    /// Valid JSON, but not an object.
    #[error("marker must be a JSON object")]
    NotAnObject,
    /// The same key twice.
    #[error("key `{0}` appears more than once")]
    DuplicateKey(String),
    /// `version` is present and is not the integer 1.
    #[error("unsupported marker version {0} (this build reads version {MARKER_VERSION})")]
    UnsupportedVersion(String),
    /// A required field is absent.
    #[error("required field `{0}` is missing")]
    MissingField(&'static str),
    /// A field has the wrong type or an out-of-range value.
    #[error("field `{field}` {reason}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Serde shim: the top-level object as an ordered list of entries, keeping duplicates so they can be
/// refused rather than silently overwritten.
struct Fields(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Fields(entries))
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

/// Refuses input nested deeper than [`MAX_NESTING`] before the JSON parser recurses into it.
fn check_nesting(bytes: &[u8]) -> Result<(), MarkerError> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(MarkerError::TooDeep);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn pid_field(field: &'static str, v: &Value) -> Result<u32, MarkerError> {
    match v {
        Value::Number(n) if n.is_u64() => {
            let n = n.as_u64().unwrap_or(0);
            u32::try_from(n)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| out_of_range(field, n))
        }
        Value::Number(n) if n.is_i64() => Err(MarkerError::InvalidField {
            field,
            reason: format!("must be in 1..={}, found {n}", u32::MAX),
        }),
        other => Err(MarkerError::InvalidField {
            field,
            reason: format!("must be an integer, found {}", brief(other)),
        }),
    }
}

fn out_of_range(field: &'static str, n: u64) -> MarkerError {
    MarkerError::InvalidField {
        field,
        reason: format!("must be in 1..={}, found {n}", u32::MAX),
    }
}

fn text_field(field: &'static str, v: Option<&Value>) -> Result<Option<String>, MarkerError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(MarkerError::InvalidField {
            field,
            reason: format!("must be a string, found {}", brief(other)),
        }),
    }
}

fn check_text(field: &'static str, text: Option<&str>, max: usize) -> Result<(), MarkerError> {
    let Some(text) = text else { return Ok(()) };
    let chars = text.chars().count();
    if chars > max {
        return Err(MarkerError::InvalidField {
            field,
            reason: format!("is {chars} characters, more than the {max} allowed"),
        });
    }
    if text.chars().any(char::is_control) {
        return Err(MarkerError::InvalidField {
            field,
            reason: "must not contain control characters".to_owned(),
        });
    }
    Ok(())
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, MarkerError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| MarkerError::InvalidField {
            field: "written_at",
            reason: format!("must be RFC 3339 with an offset such as `Z` or `+00:00` ({e})"),
        })
}

/// A short description of a JSON value for error messages (never the whole value: it may be large).
fn brief(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl Serialize for Marker {
    /// The wire form, as [`Marker::to_json`] writes it (without its checks).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire::from(self).serialize(s)
    }
}

/// The field order and optional-field rules of the JSON form.
#[derive(Serialize)]
struct Wire<'a> {
    version: u64,
    target_pid: u32,
    target_start_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stopper_pid: Option<u32>,
    #[serde(serialize_with = "serialize_time")]
    written_at: &'a DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    trigger_watcher: bool,
    /// Written only for a restart, so a stop's marker is what v1 readers have always read.
    #[serde(skip_serializing_if = "is_stop")]
    action: StopAction,
    /// Written only when asked for, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    drain_deadline_ms: Option<u64>,
}

fn is_stop(action: &StopAction) -> bool {
    *action == StopAction::Stop
}

/// `"action"`: absent or `null` is a stop.
fn action_field(value: Option<&Value>) -> Result<StopAction, MarkerError> {
    match value {
        None | Some(Value::Null) => Ok(StopAction::Stop),
        Some(Value::String(s)) if s == "stop" => Ok(StopAction::Stop),
        Some(Value::String(s)) if s == "restart" => Ok(StopAction::Restart),
        Some(v) => Err(MarkerError::InvalidField {
            field: "action",
            reason: format!("must be \"stop\" or \"restart\", found {}", brief(v)),
        }),
    }
}

/// `"drain_deadline_ms"`: absent or `null` asks for none.
fn drain_deadline_field(value: Option<&Value>) -> Result<Option<std::time::Duration>, MarkerError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(ms) => Ok(Some(std::time::Duration::from_millis(ms))),
            None => Err(MarkerError::InvalidField {
                field: "drain_deadline_ms",
                reason: format!(
                    "must be a non-negative integer (milliseconds) or null, found {}",
                    brief(v)
                ),
            }),
        },
    }
}

impl<'a> From<&'a Marker> for Wire<'a> {
    fn from(m: &'a Marker) -> Self {
        Wire {
            version: MARKER_VERSION,
            target_pid: m.target_pid,
            target_start_time: m.target_start_time,
            stopper_pid: m.stopper_pid,
            written_at: &m.written_at,
            request_id: m.request_id.as_deref(),
            reason: m.reason.as_deref(),
            trigger_watcher: m.trigger_watcher,
            action: m.action,
            drain_deadline_ms: m
                .drain_deadline
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

fn serialize_time<S: serde::Serializer>(t: &&DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

#[cfg(test)]
mod tests;
