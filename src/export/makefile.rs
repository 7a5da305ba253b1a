//! `provm export makefile`: the run's provenance as a Makefile, PROBE's
//! planned export. One rule per file the run generated (its last version):
//! its prerequisites the files the generating process read, its recipe
//! that process's command line, run in the recorded working directory.
//! A process that does not name the file it wrote among its arguments
//! wrote it through a descriptor its shell redirected, so its recipe
//! redirects its standard output to the file. A process that ran without
//! an exec (a busybox applet its shell forked) has no recorded arguments:
//! its recipe fails, saying so, rather than run the program without them.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;
use std::path::{Component, Path, PathBuf};

use provm_engine::replay::ReplayOptions;
use provm_trace::reader::Trace;

use super::ExportError;
use crate::provenance::{self, noise_kind, Activity, EntityKind, Provenance, Relation};

/// The Makefile of the run `run` names, from its provenance (embedded, or
/// derived by replaying it).
pub fn makefile(run: &ReplayOptions) -> Result<String, ExportError> {
    let trace = Trace::open(&run.trace)?;
    let graph = provenance::of_trace(&trace, run, false)?;
    Ok(render(&graph, &trace.manifest.cwd, &trace.manifest.argv))
}

/// One rule: a file, what its writer read, and the writer.
struct Rule<'a> {
    target: &'a str,
    prerequisites: BTreeSet<&'a str>,
    writer: &'a Activity,
}

fn render(graph: &Provenance, cwd: &str, argv: &[String]) -> String {
    let rules = rules(graph);
    let targets: Vec<String> = rules.iter().map(|rule| target(rule.target)).collect();
    let mut out = format!(
        "# The files a provm run generated and how, from its provenance:\n\
         # {}\n\
         # in {cwd}. Each recipe runs its process's command line there.\n\n\
         .PHONY: all\nall: {}\n",
        shell_line(argv),
        targets.join(" ")
    );
    for rule in &rules {
        let prerequisites: String = rule
            .prerequisites
            .iter()
            .map(|p| format!(" {}", target(p)))
            .collect();
        let mut recipe = format!("cd {} && {}", quote(cwd), shell_line(&rule.writer.argv));
        if !names(&rule.writer.argv, rule.target, cwd) {
            recipe.push_str(&format!(" > {}", quote(rule.target)));
        }
        if !execed(graph, &rule.writer.id) {
            recipe = format!(
                "@echo {} >&2; false",
                quote(&format!(
                    "provm: {} was written by `{}`, which its parent forked without an exec, so its arguments were not recorded: write this rule by hand",
                    rule.target,
                    rule.writer.label()
                ))
            );
        }
        // Writing to a String cannot fail. A recipe's `$` is make's unless
        // doubled.
        let _ = write!(
            out,
            "\n{}:{prerequisites}\n\t{}\n",
            target(rule.target),
            recipe.replace('$', "$$")
        );
    }
    out
}

/// The rules, in the order the run generated their files.
fn rules(graph: &Provenance) -> Vec<Rule<'_>> {
    let reads = |activity: &str| -> BTreeSet<&str> {
        graph
            .relations
            .iter()
            .filter_map(|relation| match relation {
                Relation::Used {
                    activity: user,
                    entity,
                    role,
                } if user == activity && role == "read" => graph.entity(entity),
                _ => None,
            })
            // Content that was read, and not what every process reads.
            .filter(|file| file.kind == EntityKind::File && file.sha256.is_some())
            .filter(|file| noise_kind(&file.name).is_none())
            .map(|file| file.name.as_str())
            .collect()
    };
    let mut rules: Vec<Rule<'_>> = Vec::new();
    let mut rule_of: HashMap<&str, usize> = HashMap::new();
    for relation in &graph.relations {
        let Relation::WasGeneratedBy { entity, activity } = relation else {
            continue;
        };
        let (Some(file), Some(writer)) = (graph.entity(entity), graph.activity(activity)) else {
            continue;
        };
        if file.kind != EntityKind::File {
            continue;
        }
        let mut prerequisites = reads(activity);
        prerequisites.remove(file.name.as_str());
        let rule = Rule {
            target: &file.name,
            prerequisites,
            writer,
        };
        // A later version replaces the rule of an earlier one.
        match rule_of.get(file.name.as_str()) {
            Some(&index) => rules[index] = rule,
            None => {
                rule_of.insert(&file.name, rules.len());
                rules.push(rule);
            }
        }
    }
    rules
}

/// Whether `process` began with an exec (or is the command itself), so
/// that its arguments were read at the exec.
fn execed(graph: &Provenance, process: &str) -> bool {
    graph.relations.iter().any(|relation| {
        matches!(relation, Relation::WasInformedBy { informed, how, .. }
            if informed == process && how != "fork")
    }) || graph
        .activity(process)
        .is_some_and(|activity| activity.argv.len() > 1)
}

/// Whether `argv` names `path` (as given, or relative to `cwd`).
fn names(argv: &[String], path: &str, cwd: &str) -> bool {
    let wanted = normal(&Path::new(cwd).join(path));
    argv.iter()
        .skip(1)
        .any(|arg| normal(&Path::new(cwd).join(arg)) == wanted)
}

/// `path` with `.` and `..` resolved as text (the guest's links are not
/// here to follow).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn quote(word: &str) -> String {
    shlex::try_quote(word).map_or_else(|_| word.replace('\0', ""), |quoted| quoted.into_owned())
}

/// `argv` as a shell would be given it.
pub(super) fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A path as a make target or prerequisite.
fn target(path: &str) -> String {
    path.replace('$', "$$")
        .replace(' ', "\\ ")
        .replace('#', "\\#")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::Entity;

    fn file(id: &str, name: &str) -> Entity {
        Entity {
            id: id.into(),
            kind: EntityKind::File,
            name: name.into(),
            sha256: Some("00".into()),
            size: 1,
            content: Vec::new(),
        }
    }

    fn process(id: &str, argv: &[&str]) -> Activity {
        Activity {
            id: id.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            ..Activity::default()
        }
    }

    fn used(activity: &str, entity: &str) -> Relation {
        Relation::Used {
            activity: activity.into(),
            entity: entity.into(),
            role: "read".into(),
        }
    }

    fn generated(entity: &str, activity: &str) -> Relation {
        Relation::WasGeneratedBy {
            entity: entity.into(),
            activity: activity.into(),
        }
    }

    #[test]
    fn a_writer_forked_without_an_exec_has_a_recipe_that_fails() {
        let graph = Provenance {
            activities: vec![
                process("p/sh", &["sh", "-c", "x"]),
                process("p/cat", &["cat"]),
            ],
            entities: vec![file("f/out", "/out")],
            relations: vec![
                Relation::WasInformedBy {
                    informed: "p/cat".into(),
                    informant: "p/sh".into(),
                    how: "fork".into(),
                },
                generated("f/out", "p/cat"),
            ],
        };
        let makefile = render(&graph, "/", &[]);
        assert!(
            makefile.contains("\n/out:\n\t@echo 'provm: /out was written by `cat`, which its parent forked without an exec"),
            "{makefile}"
        );
        assert!(
            makefile.ends_with("write this rule by hand' >&2; false\n"),
            "{makefile}"
        );
    }

    #[test]
    fn generated_files_are_rules_of_what_their_writer_read() {
        let graph = Provenance {
            activities: vec![
                process("p/sort", &["sort", "in.txt"]),
                process("p/cc", &["cc", "-o", "../data/prog", "prog.c"]),
            ],
            entities: vec![
                file("f/in", "/data/in.txt"),
                file("f/libc", "/lib/libc.so.6"),
                file("f/mid", "/data/mid.txt"),
                file("f/c", "/data/prog.c"),
                file("f/prog", "/data/prog"),
            ],
            relations: vec![
                used("p/sort", "f/in"),
                used("p/sort", "f/libc"),
                generated("f/mid", "p/sort"),
                used("p/cc", "f/c"),
                generated("f/prog", "p/cc"),
            ],
        };
        let makefile = render(&graph, "/data", &["sh".into(), "-c".into(), "x $y".into()]);
        assert_eq!(
            makefile,
            "# The files a provm run generated and how, from its provenance:\n\
             # sh -c 'x $y'\n\
             # in /data. Each recipe runs its process's command line there.\n\n\
             .PHONY: all\nall: /data/mid.txt /data/prog\n\
             \n/data/mid.txt: /data/in.txt\n\tcd /data && sort in.txt > /data/mid.txt\n\
             \n/data/prog: /data/prog.c\n\tcd /data && cc -o ../data/prog prog.c\n"
        );
    }
}
