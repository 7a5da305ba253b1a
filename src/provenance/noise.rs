//! What a view for people leaves out: files every process touches and
//! nobody asks about (shared libraries, /proc, locales), environments, and
//! executables, which each process box names anyway. The view says what it
//! collapsed and how many.

use std::collections::{BTreeMap, HashSet};

use super::model::{EntityKind, Provenance, Relation};

/// Path prefixes and what to call them when collapsed.
const PREFIXES: &[(&str, &str)] = &[
    ("/proc/", "/proc, /sys and /dev files"),
    ("/sys/", "/proc, /sys and /dev files"),
    ("/dev/", "/proc, /sys and /dev files"),
    ("/etc/ld.so.", "dynamic linker caches"),
    ("/usr/lib/locale/", "locale and charset files"),
    ("/usr/share/locale/", "locale and charset files"),
    ("/usr/share/i18n/", "locale and charset files"),
    (
        "/usr/lib/x86_64-linux-gnu/gconv/",
        "locale and charset files",
    ),
];

/// Why a file path is noise, if it is.
pub fn noise_kind(path: &str) -> Option<&'static str> {
    if let Some((_, kind)) = PREFIXES.iter().find(|(prefix, _)| path.starts_with(prefix)) {
        return Some(kind);
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    (name.ends_with(".so") || name.contains(".so.")).then_some("shared libraries")
}

/// The view of `document` for people, and what it collapsed: (what, how many).
pub fn collapse(document: &Provenance) -> (Provenance, Vec<(String, usize)>) {
    let executed: HashSet<&str> = document
        .relations
        .iter()
        .filter_map(|relation| match relation {
            Relation::Used { entity, role, .. } if role == "execute" => Some(entity.as_str()),
            _ => None,
        })
        .collect();
    let otherwise_touched: HashSet<&str> = document
        .relations
        .iter()
        .filter_map(|relation| match relation {
            Relation::Used { entity, role, .. } if role == "execute" => None,
            Relation::Used { entity, .. }
            | Relation::WasGeneratedBy { entity, .. }
            | Relation::WasInvalidatedBy { entity, .. } => Some(entity.as_str()),
            _ => None,
        })
        .collect();
    let mut collapsed: BTreeMap<String, usize> = BTreeMap::new();
    let mut keep = HashSet::new();
    for entity in &document.entities {
        let kind = match entity.kind {
            EntityKind::Environment => Some("environments"),
            EntityKind::File => noise_kind(&entity.name).or_else(|| {
                let only_run = executed.contains(entity.id.as_str())
                    && !otherwise_touched.contains(entity.id.as_str());
                only_run.then_some("executables (named in each process box)")
            }),
            EntityKind::VmInput | EntityKind::VmOutput => None,
        };
        match kind {
            Some(kind) => *collapsed.entry(kind.to_owned()).or_default() += 1,
            None => {
                keep.insert(entity.id.clone());
            }
        }
    }
    keep.extend(
        document
            .activities
            .iter()
            .map(|activity| activity.id.clone()),
    );
    (
        document.restricted_to(&keep),
        collapsed.into_iter().collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_and_kernel_paths_are_noise() {
        assert_eq!(
            noise_kind("/proc/self/status"),
            Some("/proc, /sys and /dev files")
        );
        assert_eq!(noise_kind("/dev/null"), Some("/proc, /sys and /dev files"));
        assert_eq!(
            noise_kind("/lib/x86_64-linux-gnu/libc.so.6"),
            Some("shared libraries")
        );
        assert_eq!(noise_kind("/usr/lib/libfoo.so"), Some("shared libraries"));
        assert_eq!(
            noise_kind("/etc/ld.so.cache"),
            Some("dynamic linker caches")
        );
        assert_eq!(
            noise_kind("/usr/lib/locale/C.utf8/LC_CTYPE"),
            Some("locale and charset files")
        );
        assert_eq!(noise_kind("/data/in.txt"), None);
        assert_eq!(noise_kind("/data/also.sorted"), None);
    }
}
