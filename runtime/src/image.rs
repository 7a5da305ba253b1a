//! The image a container's trace names: container engines unpack the
//! image into the bundle's root and may say which it was in the
//! annotations (`org.opencontainers.image.ref.name` and `.base.name`,
//! `.base.digest`; CRI-O's `io.kubernetes.cri-o.ImageName`). Podman 4.3
//! passes none, so the name falls back to the container id and the digest
//! to the root directory's own.

use std::collections::BTreeMap;

const NAMES: &[&str] = &[
    "org.opencontainers.image.ref.name",
    "org.opencontainers.image.base.name",
    "io.kubernetes.cri-o.ImageName",
];
const DIGESTS: &[&str] = &["org.opencontainers.image.base.digest"];

/// The image's name and digest, and whether the digest is the root
/// directory's (`root_digest`) for want of the image's.
pub fn named(
    id: &str,
    annotations: &BTreeMap<String, String>,
    root_digest: &str,
) -> (String, String, bool) {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|key| annotations.get(*key).filter(|v| !v.is_empty()).cloned())
    };
    let name = first(NAMES).unwrap_or_else(|| id.to_owned());
    match first(DIGESTS) {
        Some(digest) => (name, digest, false),
        None => (name, root_digest.to_owned(), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_name_the_image_else_the_id_and_root_do() {
        let none = BTreeMap::new();
        assert_eq!(
            named("c1", &none, "sha256:root"),
            ("c1".into(), "sha256:root".into(), true)
        );
        let annotations = BTreeMap::from([
            (
                "org.opencontainers.image.base.name".to_owned(),
                "busybox:1".to_owned(),
            ),
            (
                "org.opencontainers.image.base.digest".to_owned(),
                "sha256:img".to_owned(),
            ),
        ]);
        assert_eq!(
            named("c1", &annotations, "sha256:root"),
            ("busybox:1".into(), "sha256:img".into(), false)
        );
    }
}
