//! Where traces go: `$PROVM_RUNTIME_TRACES`, else the `traces` key of
//! /etc/provm/runtime.toml, else /var/lib/provm/traces; one trace per
//! container, named by its id.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub const CONFIG_FILE: &str = "/etc/provm/runtime.toml";
pub const DEFAULT_TRACES: &str = "/var/lib/provm/traces";
pub const TRACES_VARIABLE: &str = "PROVM_RUNTIME_TRACES";

/// runtime.toml.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct RuntimeConfig {
    /// The folder of the traces.
    traces: Option<PathBuf>,
}

/// The trace of the container `id`, as this host's environment and
/// configuration place it.
pub fn trace_path(id: &str) -> Result<PathBuf, String> {
    let text = match std::fs::read_to_string(CONFIG_FILE) {
        Ok(text) => Some(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(format!("cannot read {CONFIG_FILE}: {error}")),
    };
    let dir = traces_dir(std::env::var_os(TRACES_VARIABLE), text.as_deref())?;
    Ok(dir.join(format!("{id}.provm")))
}

/// The trace of the container `id`, its folder made; refused if a trace
/// is there already (a container id used again).
pub fn trace_for(id: &str) -> Result<PathBuf, String> {
    let trace = trace_path(id)?;
    let dir = trace.parent().expect("a trace is in a folder");
    std::fs::create_dir_all(dir).map_err(|error| {
        format!(
            "cannot make the traces' folder {}: {error}; set {TRACES_VARIABLE} or `traces` in {CONFIG_FILE} to a writable folder",
            dir.display()
        )
    })?;
    if trace.exists() {
        return Err(format!(
            "{} exists: a trace of another container of id {id}; move it away, or give the container another id",
            trace.display()
        ));
    }
    Ok(trace)
}

/// The traces' folder from the variable's value and the configuration
/// file's text, the variable first.
fn traces_dir(variable: Option<OsString>, config: Option<&str>) -> Result<PathBuf, String> {
    if let Some(dir) = variable.filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let config: RuntimeConfig = match config {
        Some(text) => {
            toml::from_str(text).map_err(|error| format!("{CONFIG_FILE} is not valid: {error}"))?
        }
        None => RuntimeConfig::default(),
    };
    Ok(config
        .traces
        .unwrap_or_else(|| Path::new(DEFAULT_TRACES).to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_then_the_file_then_the_default() {
        let config = Some("traces = \"/srv/traces\"\n");
        assert_eq!(
            traces_dir(Some("/tmp/t".into()), config).unwrap(),
            PathBuf::from("/tmp/t")
        );
        assert_eq!(
            traces_dir(None, config).unwrap(),
            PathBuf::from("/srv/traces")
        );
        assert_eq!(
            traces_dir(Some("".into()), None).unwrap(),
            PathBuf::from(DEFAULT_TRACES)
        );
        assert_eq!(
            traces_dir(None, Some("")).unwrap(),
            PathBuf::from(DEFAULT_TRACES)
        );
    }

    #[test]
    fn a_wrong_configuration_names_the_file() {
        let error = traces_dir(None, Some("trace = \"/x\"\n")).unwrap_err();
        assert!(error.contains(CONFIG_FILE), "{error}");
    }
}
