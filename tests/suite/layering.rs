//! The crates' layering (docs/ARCHITECTURE.md), checked against what
//! `cargo metadata` says each depends on: a crate may depend only on crates
//! of lower layers, and every crate of the workspace has a layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each workspace crate and its layer, lowest first.
const LAYERS: &[(&str, u8)] = &[
    // What needs nothing of provm: the guest's CPU model and the guest's agent.
    ("provm-cpu-model", 0),
    ("provm-guest-agent", 0),
    // The machine and the trace format, which share the CPU model: neither
    // knows the other.
    ("provm-vmm", 1),
    ("provm-trace", 1),
    // The recorder and the replayer over the VMM's seam.
    ("provm-seams", 2),
    // Analyses over a replay.
    ("provm-analysis", 3),
    // The engine: machine assembly, sessions, the run, record and replay drivers.
    ("provm-engine", 4),
    // The features and the CLI; beside them, the OCI runtime's command line
    // and containerd's shim, which runs that command line (no crate of
    // provm's).
    ("provm", 5),
    ("provm-runtime", 5),
    ("provm-shim", 5),
];

/// Workspace crate -> the workspace crates it depends on, each with
/// whether only its tests do (a dev-dependency).
fn workspace_dependencies() -> BTreeMap<String, Vec<(String, bool)>> {
    let packages = workspace_packages();
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
                .filter(|d| names.contains(&d["name"].as_str().unwrap()))
                .map(|d| {
                    (
                        d["name"].as_str().unwrap().to_owned(),
                        d["kind"].as_str() == Some("dev"),
                    )
                })
                .collect();
            (package["name"].as_str().unwrap().to_owned(), dependencies)
        })
        .collect()
}

/// The workspace's packages, as `cargo metadata` describes them.
fn workspace_packages() -> Vec<serde_json::Value> {
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
    metadata["packages"].as_array().unwrap().clone()
}

/// Every library and binary of the workspace forbids unsafe code, or, where
/// it needs some (the VMM, the engine, the guest's agent), makes clippy
/// require a `SAFETY:` comment on each unsafe block.
#[test]
fn every_crate_forbids_unsafe_code_or_documents_each_use() {
    let mut roots = 0;
    for package in workspace_packages() {
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if !kinds.iter().any(|kind| kind == "lib" || kind == "bin") {
                continue;
            }
            let root = target["src_path"].as_str().unwrap();
            let text = std::fs::read_to_string(root).unwrap();
            assert!(
                text.contains("#![forbid(unsafe_code)]")
                    || text.contains("#![deny(clippy::undocumented_unsafe_blocks)]"),
                "{root} neither forbids unsafe code nor denies undocumented unsafe blocks"
            );
            roots += 1;
        }
    }
    assert!(roots >= 9, "only {roots} crate roots found");
}

fn layer(name: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(crate_name, _)| *crate_name == name)
        .unwrap_or_else(|| panic!("{name} has no layer: add it to LAYERS and docs/ARCHITECTURE.md"))
        .1
}

/// A crate depends only on lower layers; its tests may also use a crate of
/// its own layer (the VMM's fuzzing decodes snapshots the way the trace
/// crate does), never a higher one.
#[test]
fn lower_crates_never_depend_on_higher_ones() {
    let graph = workspace_dependencies();
    assert_eq!(graph.len(), LAYERS.len(), "crates: {:?}", graph.keys());
    for (name, dependencies) in &graph {
        for (dependency, tests_only) in dependencies {
            let allowed = match tests_only {
                true => layer(dependency) <= layer(name),
                false => layer(dependency) < layer(name),
            };
            assert!(
                allowed,
                "{name} (layer {}) depends on {dependency} (layer {}){}",
                layer(name),
                layer(dependency),
                if *tests_only { " in its tests" } else { "" }
            );
        }
    }
}

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            found.push((path, text));
        }
    }
    found
}

fn folder(crate_folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_folder)
}

/// The engine parses no command line and prints nothing: what the user
/// should hear goes out as a notice (`provm_engine::notice!`), and the
/// command line decides how to show it.
#[test]
fn the_engine_has_no_command_line_code() {
    let manifest = std::fs::read_to_string(folder("engine/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("clap"),
        "engine/Cargo.toml depends on clap"
    );
    for (path, text) in sources(&folder("engine/src")) {
        for printing in ["println!", "eprintln!", "print!(", "eprint!(", "clap::"] {
            assert!(
                !text.contains(printing),
                "{} uses {printing}",
                path.display()
            );
        }
    }
}

/// What a row of docs/ARCHITECTURE.md's table names as modules: each code
/// span that is a file (`vm.rs`) or a folder (`transfer/`), and each part
/// of a path (`observer::Observer` names `observer.rs` or `observer/`).
fn modules_named(row: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for span in row.split('`').skip(1).step_by(2) {
        named.insert(span.to_owned());
        for part in span.split("::") {
            named.insert(format!("{part}.rs"));
            named.insert(format!("{part}/"));
        }
    }
    named
}

/// The modules of the crate in `src`, tests left out, each as its path
/// under `src` and the name the architecture gives it: a file's name, or
/// for a folder's `mod.rs` the folder's with a slash.
fn modules(src: &Path) -> Vec<(String, String)> {
    let sources = sources(src);
    let test_files = test_module_files(&sources);
    let mut found: Vec<(String, String)> = sources
        .iter()
        .map(|(path, _)| path)
        .filter(|path| !test_files.iter().any(|test| path.starts_with(test)))
        .filter(|path| path.parent() != Some(src) || !path.ends_with("lib.rs"))
        .map(|path| {
            let relative = path.strip_prefix(src).unwrap().display().to_string();
            let file = path.file_name().unwrap().to_string_lossy();
            let name = match file.as_ref() {
                "mod.rs" => format!(
                    "{}/",
                    path.parent()
                        .unwrap()
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                ),
                _ => file.into_owned(),
            };
            (relative, name)
        })
        .collect();
    found.sort();
    found
}

/// A newcomer finds every module of the engine and the VMM in
/// docs/ARCHITECTURE.md, in its crate's row.
#[test]
fn the_architecture_names_every_module_of_the_engine_and_the_vmm() {
    let architecture = std::fs::read_to_string(folder("docs/ARCHITECTURE.md")).unwrap();
    let mut unnamed = Vec::new();
    for (name, crate_folder) in [("provm-engine", "engine/src"), ("provm-vmm", "vmm/src")] {
        let row = architecture
            .lines()
            .find(|line| line.starts_with("| ") && line.contains(&format!("`{name}`")))
            .unwrap_or_else(|| panic!("docs/ARCHITECTURE.md has no row for {name}"));
        let named = modules_named(row);
        let modules = modules(&folder(crate_folder));
        assert!(modules.len() > 20, "{crate_folder}: {modules:?}");
        unnamed.extend(
            modules
                .into_iter()
                .filter(|(_, module)| !named.contains(module))
                .map(|(path, module)| format!("{crate_folder}/{path} (as `{module}`)")),
        );
    }
    assert!(
        unnamed.is_empty(),
        "docs/ARCHITECTURE.md does not name these modules in their crate's row:\n  {}",
        unnamed.join("\n  ")
    );
}

#[test]
fn a_row_names_files_folders_and_the_parts_of_paths() {
    let named = modules_named("| the machine (`machine.rs`), `transfer/`, `observer::Observer` |");
    for module in ["machine.rs", "transfer/", "observer.rs", "observer/"] {
        assert!(named.contains(module), "{module}: {named:?}");
    }
    assert!(!named.contains("the.rs"), "{named:?}");
}

/// `text` without the items under `#[cfg(test)]`: a test module's block,
/// or a one-line item (`mod tests;`). What comes after a test block is read.
fn without_tests(text: &str) -> String {
    let mut kept = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let item = &rest[at..];
        let end = match (item.find(';'), item.find('{')) {
            (Some(semicolon), Some(brace)) if semicolon < brace => semicolon + 1,
            (_, Some(brace)) => {
                let mut depth = 0;
                let close = item[brace..].char_indices().find_map(|(offset, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    (depth == 0).then_some(brace + offset + 1)
                });
                close.unwrap_or(item.len())
            }
            (Some(semicolon), None) => semicolon + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    kept.push_str(rest);
    kept
}

/// The files of the modules that `files` declare for tests only
/// (`#[cfg(test)] mod NAME;`): each `NAME.rs`, and its folder `NAME/`.
fn test_module_files(files: &[(PathBuf, String)]) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    for (path, text) in files {
        let parent = path.parent().unwrap();
        // Where this file's child modules are.
        let dir = match path.file_stem().unwrap().to_str().unwrap() {
            "mod" | "lib" | "main" => parent.to_owned(),
            stem => parent.join(stem),
        };
        for (at, attribute) in text.match_indices("#[cfg(test)]") {
            let item = &text[at + attribute.len()..];
            // A declaration ends at its `;` (a `mod tests { .. }` block is
            // inline: `without_tests` cuts it).
            let Some(end) = item
                .find([';', '{'])
                .filter(|&end| item[end..].starts_with(';'))
            else {
                continue;
            };
            let declaration = item[..end].trim();
            let name = ["pub(crate) mod ", "pub mod ", "mod "]
                .iter()
                .find_map(|keyword| declaration.strip_prefix(keyword));
            if let Some(name) =
                name.filter(|name| name.chars().all(|c| c.is_alphanumeric() || c == '_'))
            {
                found.insert(dir.join(format!("{name}.rs")));
                found.insert(dir.join(name));
            }
        }
    }
    found
}

/// The top-level modules of the crate in `src` and those each names
/// (`crate::NAME`), tests left out: test blocks, and the files of modules
/// declared for tests only.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let sources = sources(src);
    let test_files = test_module_files(&sources);
    for (path, text) in sources {
        if test_files
            .iter()
            .any(|test_file| path.starts_with(test_file))
        {
            continue;
        }
        let relative = path.strip_prefix(src).unwrap();
        let module = relative.iter().next().unwrap().to_string_lossy();
        let module = module.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = without_tests(&text);
        files.entry(module).or_default().push(text);
    }
    let names: Vec<String> = files.keys().cloned().collect();
    files
        .into_iter()
        .map(|(module, texts)| {
            let mut named = BTreeSet::new();
            for text in &texts {
                for (at, _) in text.match_indices("crate::") {
                    let rest = &text[at + "crate::".len()..];
                    let mut mentioned: Vec<&str> = vec![rest];
                    // `use crate::{a, b::c}`
                    if let Some(group) = rest.strip_prefix('{') {
                        mentioned = group[..group.find('}').unwrap_or(0)].split(',').collect();
                    }
                    for item in mentioned {
                        let name: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect();
                        if name != module && names.contains(&name) {
                            named.insert(name);
                        }
                    }
                }
            }
            (module, named)
        })
        .collect()
}

/// A cycle among `graph`'s modules, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|seen| seen == module) {
            return Some(path[start..].to_vec());
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in &graph[module] {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

/// Within every crate, modules form layers too: no two need each other.
#[test]
fn no_module_imports_form_a_cycle() {
    let crates = [
        "cpu-model/src",
        "vmm/src",
        "trace/src",
        "guest-agent/src",
        "seams/src",
        "analysis/src",
        "engine/src",
        "src",
        "runtime/src",
        "shim/src",
    ];
    for crate_folder in crates {
        let graph = module_graph(&folder(crate_folder));
        assert!(graph.len() > 5, "{crate_folder}: {graph:?}");
        if let Some(cycle) = cycle(&graph) {
            panic!(
                "{crate_folder}: modules import each other: {}",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("run", &["fast_start"][..]),
        ("fast_start", &["disk", "run"]),
        ("disk", &[]),
    ]
    .into_iter()
    .map(|(module, named)| {
        (
            module.to_owned(),
            named.iter().map(|name| name.to_string()).collect(),
        )
    })
    .collect();
    assert_eq!(cycle(&graph), Some(vec!["fast_start".into(), "run".into()]));
}

#[test]
fn test_items_are_left_out_and_what_follows_them_is_read() {
    let text =
        "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { {} }\n}\n\
                #[cfg(test)]\nmod fuzz;\nuse crate::c;\n";
    let kept = without_tests(text);
    assert!(
        kept.contains("crate::a") && kept.contains("crate::c"),
        "{kept}"
    );
    assert!(
        !kept.contains("crate::b") && !kept.contains("mod fuzz"),
        "{kept}"
    );
}

#[test]
fn the_files_of_modules_declared_for_tests_are_test_code() {
    let files = vec![
        (
            PathBuf::from("src/lib.rs"),
            "#[cfg(test)]\nmod fuzz;\npub mod probes;\n".to_owned(),
        ),
        (
            PathBuf::from("src/probes/mod.rs"),
            "pub mod port_exit;\n#[cfg(test)]\nmod stability;\n#[cfg(test)]\nmod tests {}\n"
                .to_owned(),
        ),
        (
            PathBuf::from("src/vm.rs"),
            "#[cfg(test)]\npub(crate) mod harness;\n".to_owned(),
        ),
    ];
    let expected: BTreeSet<PathBuf> = [
        "src/fuzz.rs",
        "src/fuzz",
        "src/probes/stability.rs",
        "src/probes/stability",
        "src/vm/harness.rs",
        "src/vm/harness",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(test_module_files(&files), expected);
}
