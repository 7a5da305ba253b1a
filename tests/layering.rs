//! The crates' layering (docs/ARCHITECTURE.md), checked against what
//! `cargo metadata` says each depends on: a crate may depend only on crates
//! of lower layers, and every crate of the workspace has a layer.

use std::collections::BTreeMap;
use std::process::Command;

/// Each workspace crate and its layer, lowest first.
const LAYERS: &[(&str, u8)] = &[
    // The machine, the trace format and the guest's agent: none knows the others.
    ("provm-vmm", 0),
    ("provm-trace", 0),
    ("provm-guest-agent", 0),
    // The recorder and the replayer over the VMM's seam.
    ("provm-seams", 1),
    // Analyses over a replay.
    ("provm-analysis", 2),
    // The engine, the features and the CLI.
    ("provm", 3),
];

/// Workspace crate -> the workspace crates it depends on (any kind).
fn workspace_dependencies() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let names: Vec<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    packages
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap())
                .filter(|name| names.contains(name))
                .map(str::to_owned)
                .collect();
            (package["name"].as_str().unwrap().to_owned(), dependencies)
        })
        .collect()
}

fn layer(name: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(crate_name, _)| *crate_name == name)
        .unwrap_or_else(|| panic!("{name} has no layer: add it to LAYERS and docs/ARCHITECTURE.md"))
        .1
}

#[test]
fn lower_crates_never_depend_on_higher_ones() {
    let graph = workspace_dependencies();
    assert_eq!(graph.len(), LAYERS.len(), "crates: {:?}", graph.keys());
    for (name, dependencies) in &graph {
        for dependency in dependencies {
            assert!(
                layer(dependency) < layer(name),
                "{name} (layer {}) depends on {dependency} (layer {})",
                layer(name),
                layer(dependency)
            );
        }
    }
}
