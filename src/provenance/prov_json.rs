//! PROV-JSON (W3C Member Submission, 2013): the standard serialisation,
//! for PROV tools. Identifiers are QNames in the `provm` namespace;
//! relations get blank-node ids.

use provm_engine::utc::Utc;
use serde_json::{json, Map, Value};

use super::model::{Activity, Entity, EntityKind, Provenance, Relation};

/// provm's own namespace for ids and attributes.
pub const NAMESPACE: &str = "urn:provm:";

fn qname(id: &str) -> String {
    format!("provm:{id}")
}

pub fn export(document: &Provenance) -> Value {
    let mut bundle = Map::new();
    bundle.insert(
        "prefix".into(),
        json!({ "provm": NAMESPACE, "xsd": "http://www.w3.org/2001/XMLSchema#" }),
    );
    let entities: Map<String, Value> = document
        .entities
        .iter()
        .map(|entity| (qname(&entity.id), entity_attributes(entity)))
        .collect();
    let activities: Map<String, Value> = document
        .activities
        .iter()
        .map(|activity| (qname(&activity.id), activity_attributes(activity)))
        .collect();
    bundle.insert("entity".into(), Value::Object(entities));
    bundle.insert("activity".into(), Value::Object(activities));
    for (index, relation) in document.relations.iter().enumerate() {
        let (kind, attributes) = relation_attributes(relation);
        let group = bundle
            .entry(kind)
            .or_insert_with(|| Value::Object(Map::new()));
        group
            .as_object_mut()
            .unwrap()
            .insert(format!("_:r{index}"), attributes);
    }
    Value::Object(bundle)
}

fn entity_attributes(entity: &Entity) -> Value {
    let kind = match entity.kind {
        EntityKind::File => "provm:FileVersion",
        EntityKind::Environment => "provm:Environment",
        EntityKind::VmInput => "provm:VmInput",
        EntityKind::VmOutput => "provm:VmOutput",
    };
    let mut attributes = json!({
        "prov:type": { "$": kind, "type": "xsd:QName" },
        "prov:label": entity.name,
        "provm:size": entity.size,
    });
    if let Some(sha256) = &entity.sha256 {
        attributes["provm:sha256"] = json!(sha256);
    }
    if !entity.content.is_empty() {
        attributes["provm:content"] = json!(entity.content);
    }
    attributes
}

fn activity_attributes(activity: &Activity) -> Value {
    let mut attributes = json!({
        "prov:label": activity.label(),
        "prov:startTime": date_time(activity.start_ns),
        "prov:endTime": date_time(activity.end_ns),
        "provm:pid": activity.pid,
        "provm:exe": activity.exe,
    });
    if !activity.argv.is_empty() {
        attributes["provm:argv"] = json!(activity.argv);
    }
    if let Some(outcome) = &activity.outcome {
        attributes["provm:outcome"] = json!(outcome);
    }
    attributes
}

fn relation_attributes(relation: &Relation) -> (String, Value) {
    let (kind, value) = match relation {
        Relation::Used {
            activity,
            entity,
            role,
        } => (
            "used",
            json!({ "prov:activity": qname(activity), "prov:entity": qname(entity),
                    "prov:role": format!("provm:{role}") }),
        ),
        Relation::WasGeneratedBy { entity, activity } => (
            "wasGeneratedBy",
            json!({ "prov:entity": qname(entity), "prov:activity": qname(activity) }),
        ),
        Relation::WasInformedBy {
            informed,
            informant,
            how,
        } => (
            "wasInformedBy",
            json!({ "prov:informed": qname(informed), "prov:informant": qname(informant),
                    "provm:how": how }),
        ),
        Relation::WasStartedBy { activity, starter } => (
            "wasStartedBy",
            json!({ "prov:activity": qname(activity), "prov:starter": qname(starter) }),
        ),
        Relation::WasDerivedFrom {
            generated,
            used,
            activity,
            how,
        } => {
            let mut value = json!({ "prov:generatedEntity": qname(generated),
                "prov:usedEntity": qname(used), "prov:activity": qname(activity),
                "provm:how": how });
            if how == "rename" {
                value["prov:type"] = json!({ "$": "prov:Revision", "type": "xsd:QName" });
            }
            ("wasDerivedFrom", value)
        }
        Relation::WasInvalidatedBy { entity, activity } => (
            "wasInvalidatedBy",
            json!({ "prov:entity": qname(entity), "prov:activity": qname(activity) }),
        ),
    };
    (kind.to_owned(), value)
}

/// xsd:dateTime (RFC 3339, UTC) of nanoseconds since the epoch.
pub fn date_time(ns: u64) -> String {
    let t = Utc::from_unix_ns(ns);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second, t.nanosecond
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_xsd_date_times() {
        assert_eq!(date_time(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            date_time(951_782_400_000_000_007),
            "2000-02-29T00:00:00.000000007Z"
        );
        assert_eq!(
            date_time(1_700_000_000_123_000_000),
            "2023-11-14T22:13:20.123000000Z"
        );
    }

    #[test]
    fn relations_are_grouped_by_kind_with_qualified_ids() {
        let document = Provenance {
            activities: vec![Activity {
                id: "process/0".into(),
                exe: "/bin/sort".into(),
                argv: vec!["sort".into(), "in.txt".into()],
                ..Activity::default()
            }],
            entities: vec![Entity {
                id: "file/0".into(),
                kind: EntityKind::File,
                name: "/data/in.txt".into(),
                sha256: Some("ab".into()),
                size: 2,
                content: Vec::new(),
            }],
            relations: vec![Relation::Used {
                activity: "process/0".into(),
                entity: "file/0".into(),
                role: "read".into(),
            }],
        };
        let json = export(&document);
        assert_eq!(
            json["activity"]["provm:process/0"]["prov:label"],
            "sort in.txt"
        );
        assert_eq!(json["entity"]["provm:file/0"]["provm:sha256"], "ab");
        assert_eq!(json["used"]["_:r0"]["prov:entity"], "provm:file/0");
        assert_eq!(json["used"]["_:r0"]["prov:role"], "provm:read");
    }
}
