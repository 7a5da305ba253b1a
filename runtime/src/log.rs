//! Errors and warnings as runc writes them: to standard error and, with
//! `--log`, to the log file, as text (`time=... level=... msg=...`) or
//! with `--log-format json` one JSON object a line, which Podman reads
//! back when a runtime fails.

use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cli::LogFormat;

#[derive(Clone)]
pub struct Log {
    file: Option<PathBuf>,
    format: LogFormat,
    debug: bool,
}

impl Log {
    /// With `debug`, warnings go to standard error when there is no log.
    pub fn new(file: Option<PathBuf>, format: LogFormat, debug: bool) -> Log {
        Log {
            file,
            format,
            debug,
        }
    }

    /// An error: on standard error and in the log.
    pub fn error(&self, message: &str) {
        eprintln!("provm-runtime: {message}");
        self.write("error", message);
    }

    /// A warning: in the log; on standard error only with `--debug` and no
    /// log, as a container engine shows what `create` writes there as the
    /// container's own output.
    pub fn warn(&self, message: &str) {
        match self.file {
            Some(_) => self.write("warning", message),
            None if self.debug => eprintln!("provm-runtime: warning: {message}"),
            None => {}
        }
    }

    /// A debug line (`--debug` only): in the log, else on standard error,
    /// as runc writes its own.
    pub fn debug(&self, message: &str) {
        match (&self.file, self.debug) {
            (_, false) => {}
            (Some(_), true) => self.write("debug", message),
            (None, true) => eprintln!("provm-runtime: debug: {message}"),
        }
    }

    fn write(&self, level: &str, message: &str) {
        let Some(path) = &self.file else { return };
        let line = line(self.format, level, message, &now());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(error) = written {
            eprintln!(
                "provm-runtime: cannot write the log {}: {error}",
                path.display()
            );
        }
    }
}

/// Sends the engine's debug events (its phases and their times: the
/// root's disk, the booted guest, the restore, the command, the trace) to
/// `log`'s debug lines, one line an event, its fields after its message.
pub fn engine_debug_into(log: Log) {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    // provm's own events, not its libraries' tracing.
    let provm = tracing_subscriber::filter::filter_fn(|event| {
        event.target().starts_with("provm") && *event.level() <= tracing::Level::DEBUG
    });
    let subscriber = tracing_subscriber::registry().with(DebugLines(log).with_filter(provm));
    // Only fails if one is already installed, which nothing else does.
    tracing::subscriber::set_global_default(subscriber).ok();
}

/// Writes each event as a debug line of the runtime's log.
struct DebugLines(Log);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DebugLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        self.0.debug(&format!("{}{}", line.message, line.fields));
    }
}

/// An event's message and its other fields as ` name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            name => self.fields.push_str(&format!(" {name}={value:?}")),
        }
    }
}

/// The time as runc's logs stamp it (RFC 3339, UTC).
pub fn now() -> String {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    provm_engine::utc::Utc::from_unix_ns(ns).iso_8601()
}

fn line(format: LogFormat, level: &str, message: &str, time: &str) -> String {
    match format {
        LogFormat::Json => {
            let entry = serde_json::json!({"level": level, "msg": message, "time": time});
            format!("{entry}\n")
        }
        LogFormat::Text => format!("time={time:?} level={level} msg={message:?}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_runcs() {
        let json = line(LogFormat::Json, "error", "no \"x\"", "T");
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["level"], "error");
        assert_eq!(parsed["msg"], "no \"x\"");
        assert_eq!(parsed["time"], "T");
        assert!(json.ends_with('\n'));
        assert_eq!(
            line(LogFormat::Text, "warning", "a b", "T"),
            "time=\"T\" level=warning msg=\"a b\"\n"
        );
    }

    #[test]
    fn errors_reach_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.json");
        let log = Log::new(Some(path.clone()), LogFormat::Json, false);
        log.error("first");
        log.warn("second");
        let text = std::fs::read_to_string(path).unwrap();
        let levels: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["level"].to_string())
            .collect();
        assert_eq!(levels, ["\"error\"", "\"warning\""]);
    }
}
