//! The README and the book (`docs/`, an mdBook) stay true to the code: the
//! README is a front page, every link resolves, every chapter is in the
//! book's table of contents, every repository path they name exists, and
//! the command reference is what `provm help` prints.
//!
//! `PROVM_UPDATE_DOCS=1 cargo test --release docs::` writes the command
//! reference again after a change to the command line.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::provm;

/// The README is the front page; the rest is in the book.
const README_LINES: usize = 300;

/// Every command, in the order `provm help` lists them.
const COMMANDS: &[&str] = &[
    "run", "record", "replay", "repro", "inspect", "diff", "graph", "query", "export", "blame",
    "recover", "kernel",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every Markdown page of the book.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages.push(repo().join("README.md"));
    pages
}

/// The targets of the Markdown links `[text](target)` in `text`, without
/// their `#anchor`, leaving out web addresses.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap();
            (!target.is_empty() && !target.contains("://")).then_some(target)
        })
        .collect()
}

/// The repository paths named in code spans: a word with a slash that
/// ends in a source or script file's extension, such as
/// `vmm/src/seam.rs`.
fn named_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.contains(char::is_whitespace)
                && span.contains('/')
                && [".rs", ".sh", ".md", ".toml", ".c", ".patch"]
                    .iter()
                    .any(|ext| span.ends_with(ext))
        })
        .collect()
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_LINES,
        "README.md has {lines} lines: move detail into the book (docs/)"
    );
    for command in ["scripts/demo", "scripts/test"] {
        assert!(readme.contains(&format!("\n    {command}\n")), "{command}");
    }
}

#[test]
fn every_link_resolves_and_every_chapter_is_in_the_book() {
    let summary = fs::read_to_string(repo().join("docs/SUMMARY.md")).unwrap();
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for target in link_targets(&text) {
            if !dir.join(target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
        let name = page.file_name().unwrap().to_str().unwrap();
        let in_book = page.starts_with(repo().join("docs"));
        if in_book && name != "SUMMARY.md" && !summary.contains(&format!("({name})")) {
            broken.push(format!("{name} is not in docs/SUMMARY.md"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut missing = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        for named in named_paths(&text) {
            // Paths in the guest, the cache or a trace are not the
            // repository's.
            let absolute = named.starts_with('/') || named.starts_with('~');
            if !absolute && !repo().join(named).exists() {
                missing.push(format!("{}: {named}", page.display()));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

/// Every file under `dir`, with its path.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_under(&path));
        }
        found.push(path);
    }
    found
}

/// docs/ARCHITECTURE.md's table names, in each crate's row, the crate's
/// folder and its modules: files (`vm.rs`), folders (`transfer/`) and
/// items (`observer::Observer`). Each must be in that crate's sources.
#[test]
fn every_module_the_architecture_names_exists() {
    let architecture = fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut rows = 0;
    for row in architecture.lines().filter(|line| line.starts_with("| ")) {
        let spans: Vec<&str> = row.split('`').skip(1).step_by(2).collect();
        // The crate's folder is the first span that ends in a slash.
        let Some(folder) = spans.iter().find(|span| span.ends_with('/')) else {
            continue;
        };
        let src = match *folder {
            "src/" => repo().join("src"),
            folder => repo().join(folder).join("src"),
        };
        if !src.is_dir() {
            continue;
        }
        rows += 1;
        let files = files_under(&src);
        let named = |name: &str| {
            files
                .iter()
                .any(|file| file.file_name().is_some_and(|file| file == name))
        };
        for span in spans.iter().filter(|span| *span != folder) {
            let exists = if let Some(file) = span.strip_suffix('/') {
                named(file)
            } else if span.ends_with(".rs") {
                named(span)
            } else if let Some((module, item)) = span.split_once("::") {
                let module_file = format!("{module}.rs");
                files.iter().any(|file| {
                    let name = file.file_name().unwrap().to_string_lossy();
                    (name == module_file.as_str() || name == module)
                        && fs::read_to_string(if file.is_dir() {
                            file.join("mod.rs")
                        } else {
                            file.clone()
                        })
                        .is_ok_and(|text| text.contains(item.split("::").next().unwrap()))
                })
            } else {
                true
            };
            if !exists {
                missing.push(format!("{folder}: {span}"));
            }
        }
    }
    assert!(rows >= 6, "the architecture table has {rows} crate rows");
    assert!(missing.is_empty(), "{missing:#?}");
}

/// The command reference: `provm help` and each command's.
fn command_reference() -> String {
    let help = |args: &[&str]| {
        let finished = provm(args);
        assert_eq!(finished.status, 0, "{args:?}: {}", finished.stderr);
        finished.stdout.trim_end().to_owned()
    };
    let mut reference = String::from(
        "# Command reference\n\n\
         What `provm help` prints, for provm and each command (written by\n\
         `PROVM_UPDATE_DOCS=1 cargo test --release docs::`; a test fails when\n\
         it is not what the binary prints).\n\n",
    );
    reference += &format!("## provm\n\n```text\n{}\n```\n", help(&["help"]));
    for command in COMMANDS {
        reference += &format!(
            "\n## provm {command}\n\n```text\n{}\n```\n",
            help(&["help", command])
        );
    }
    reference
}

#[test]
fn the_command_reference_is_what_provm_help_prints() {
    let path = repo().join("docs/commands.md");
    let generated = command_reference();
    if std::env::var_os("PROVM_UPDATE_DOCS").is_some() {
        fs::write(&path, &generated).unwrap();
    }
    let written = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == generated,
        "docs/commands.md is not what `provm help` prints: run PROVM_UPDATE_DOCS=1 cargo test --release docs::"
    );
}

#[test]
fn the_link_and_path_finders_find_what_they_should() {
    let text = "see [the hosts](hosts.md#vmx), [web](https://x.org) and \
                `vmm/src/seam.rs`, `provm run`, `/data/x.rs`";
    assert_eq!(link_targets(text), ["hosts.md"]);
    assert_eq!(named_paths(text), ["vmm/src/seam.rs", "/data/x.rs"]);
}
