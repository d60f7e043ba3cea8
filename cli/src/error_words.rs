//! A library error as the command line reports it: its causes on one line, and the flag or verb
//! that does what the library's own words describe (the library never names the command line,
//! since an application embedding it may not ship this tool).

/// An error and its causes on one line. The library's errors leave their cause to the source
/// chain, so a person sees `cannot use marker directory /x: Permission denied (os error 13)`.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    let mut words = command_line_words(error);
    while let Some(next) = cause {
        line.push_str(": ");
        line.push_str(&next.to_string());
        words = words.or_else(|| command_line_words(next));
        cause = next.source();
    }
    if let Some(words) = words {
        line.push_str(" (");
        line.push_str(words);
        line.push(')');
    }
    line
}

/// What the command line adds to a library error it reports: the flag or verb that does what the
/// library's own words name in its API (the library never names the command line, since an
/// application embedding it may not ship this tool).
fn command_line_words(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use planned_stop::marker::StoreError;
    use planned_stop::stopper::StopperError;
    if let Some(e) = error.downcast_ref::<StoreError>() {
        return match e {
            StoreError::SharedDirectory { .. } => Some("`--allow-shared-dir`"),
            StoreError::SharedStateDirectory { .. } => Some("`--allow-shared-state`"),
            StoreError::SlotBusy { .. } => {
                Some("`planned-stop clear --marker FILE` removes it; `--dir` is the slot layout")
            }
            _ => None,
        };
    }
    if let Some(StopperError::NotWatching { .. }) = error.downcast_ref::<StopperError>() {
        return Some("check --pid and --dir; `--signal-anyway` insists");
    }
    use planned_stop::StartError;
    match error.downcast_ref::<StartError>() {
        Some(StartError::LeaseTooShort { .. }) => return Some("`--lease-ms`"),
        // Transparent: the wrapped error's words are the ones to add.
        Some(StartError::Store(store)) => return command_line_words(store),
        Some(StartError::Records(records)) => return command_line_words(records),
        _ => {}
    }
    use planned_stop::record::RecordError;
    match error.downcast_ref::<RecordError>() {
        Some(RecordError::UnknownItem { .. }) => {
            Some("`planned-stop records list` shows what there is")
        }
        // Transparent: its source is the store error's own, so look at the store error itself.
        Some(RecordError::Write(store)) => command_line_words(store),
        _ => None,
    }
}
