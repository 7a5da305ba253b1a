//! DOT for people, in the PROV convention: entities (files) as yellow
//! ellipses, activities (processes) as blue boxes, arrows from effect to
//! cause. Noise is collapsed (see noise.rs) into one note that says what
//! was left out. SVG is graphviz's rendering of the same DOT.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use super::model::{Activity, Entity, EntityKind, Provenance, Relation};
use super::noise;
use super::ProvenanceError;

pub fn export(document: &Provenance) -> String {
    let (view, collapsed) = noise::collapse(document);
    let mut dot = String::from(
        "digraph provenance {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n  \
         edge [fontname=\"Helvetica\", fontsize=8];\n",
    );
    for entity in &view.entities {
        let _ = writeln!(dot, "  {} [{}];", quote(&entity.id), entity_style(entity));
    }
    for activity in &view.activities {
        let _ = writeln!(
            dot,
            "  {} [{}];",
            quote(&activity.id),
            activity_style(activity)
        );
    }
    for relation in &view.relations {
        if let Some(label) = edge_label(relation) {
            let (from, to) = relation.ends();
            let _ = writeln!(
                dot,
                "  {} -> {} [label={}];",
                quote(from),
                quote(to),
                quote(&label)
            );
        }
    }
    if !collapsed.is_empty() {
        let lines: Vec<String> = collapsed
            .iter()
            .map(|(what, count)| format!("{count} {what}"))
            .collect();
        let label = format!("collapsed:\n{}", lines.join("\n"));
        let _ = writeln!(dot, "  collapsed [shape=note, label={}];", quote(&label));
    }
    dot.push_str("}\n");
    dot
}

/// The SVG graphviz's `dot` draws of the DOT export.
pub fn svg(document: &Provenance) -> Result<Vec<u8>, ProvenanceError> {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ProvenanceError::Graphviz)?;
    let input = export(document);
    let mut stdin = child.stdin.take().unwrap();
    // A thread feeds dot while its output is read: a large graph fills both pipes.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child
        .wait_with_output()
        .map_err(ProvenanceError::Graphviz)?;
    let _ = writer.join();
    if !output.status.success() {
        let message = String::from_utf8_lossy(&output.stderr).into_owned();
        return Err(ProvenanceError::GraphvizFailed(message));
    }
    Ok(output.stdout)
}

fn entity_style(entity: &Entity) -> String {
    let mut label = entity.name.clone();
    if let Some(sha256) = &entity.sha256 {
        let _ = write!(label, "\nsha256 {}", &sha256[..12.min(sha256.len())]);
    }
    let color = match entity.kind {
        EntityKind::File | EntityKind::Environment => "#FFFC87",
        EntityKind::VmInput | EntityKind::VmOutput => "#FFE0A0",
    };
    format!(
        "shape=ellipse, style=filled, fillcolor=\"{color}\", label={}",
        quote(&label)
    )
}

fn activity_style(activity: &Activity) -> String {
    let mut label = activity.label();
    if activity.pid != 0 {
        let _ = write!(label, "\npid {}", activity.pid);
    }
    if let Some(outcome) = &activity.outcome {
        let _ = write!(label, ", {outcome}");
    }
    format!(
        "shape=box, style=filled, fillcolor=\"#9FB1FC\", label={}",
        quote(&label)
    )
}

/// The label of an edge drawn for the relation; `None` for relations that
/// other edges imply (wasStartedBy beside wasInformedBy, derivations by a
/// write beside used and wasGeneratedBy).
fn edge_label(relation: &Relation) -> Option<String> {
    Some(match relation {
        Relation::Used { role, .. } if role == "read" => "used".into(),
        Relation::Used { role, .. } => format!("used ({role})"),
        Relation::WasGeneratedBy { .. } => "wasGeneratedBy".into(),
        Relation::WasInformedBy { how, .. } => format!("wasInformedBy ({how})"),
        Relation::WasDerivedFrom { how, .. } if how == "write" => return None,
        Relation::WasDerivedFrom { how, .. } => format!("wasDerivedFrom ({how})"),
        Relation::WasInvalidatedBy { .. } => "wasInvalidatedBy".into(),
        Relation::WasStartedBy { .. } => return None,
    })
}

/// A DOT string literal.
fn quote(text: &str) -> String {
    let mut quoted = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_ellipses_processes_boxes_and_noise_a_note() {
        let file = |id: &str, name: &str| Entity {
            id: id.into(),
            kind: EntityKind::File,
            name: name.into(),
            sha256: None,
            size: 0,
            content: Vec::new(),
        };
        let document = Provenance {
            activities: vec![Activity {
                id: "process/0".into(),
                pid: 7,
                exe: "/bin/cat".into(),
                argv: vec!["cat".into(), "a \"b\"".into()],
                outcome: Some("exit 0".into()),
                ..Activity::default()
            }],
            entities: vec![file("file/0", "/data/a"), file("file/1", "/lib/libc.so.6")],
            relations: vec![
                Relation::Used {
                    activity: "process/0".into(),
                    entity: "file/0".into(),
                    role: "read".into(),
                },
                Relation::Used {
                    activity: "process/0".into(),
                    entity: "file/1".into(),
                    role: "read".into(),
                },
            ],
        };
        let dot = export(&document);
        assert!(dot.contains("\"file/0\" [shape=ellipse"), "{dot}");
        assert!(
            dot.contains("label=\"cat a \\\"b\\\"\\npid 7, exit 0\""),
            "{dot}"
        );
        assert!(
            dot.contains("\"process/0\" -> \"file/0\" [label=\"used\"]"),
            "{dot}"
        );
        assert!(!dot.contains("file/1"), "{dot}");
        assert!(dot.contains("1 shared libraries"), "{dot}");
    }
}
