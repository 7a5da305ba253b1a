use super::*;

/// A bundle as Podman 4.3 writes it (trimmed), with a root directory.
fn podman_like(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs/bin")).unwrap();
    let mut config = serde_json::json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0, "umask": 18},
            "args": ["sh", "-c", "echo hi"],
            "env": ["PATH=/bin", "FOO=bar"],
            "cwd": "/tmp",
            "capabilities": {"bounding": ["CAP_CHOWN"]},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
        },
        "root": {"path": "rootfs"},
        "hostname": "f88863cd15b1",
        "mounts": [
            {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["ro", "rprivate", "rbind"]},
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/etc/hosts", "type": "bind", "source": "/run/x/userdata/hosts", "options": ["bind"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"}
        ],
        "annotations": {"io.container.manager": "libpod"},
        "linux": {
            "resources": {
                "devices": [{"allow": false, "access": "rwm"}],
                "pids": {"limit": 2048},
                "cpu": {"quota": 150000, "period": 100000},
                "memory": {"limit": 536870912u64}
            },
            "namespaces": [{"type": "pid"}, {"type": "mount"}],
            "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}
        }
    });
    edit(&mut config);
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    bundle
}

#[test]
fn a_podman_bundle_becomes_a_plan() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = podman_like(dir.path(), |_| {});
    let read = read(&bundle).unwrap();
    let plan = read.plan;
    assert_eq!(plan.rootfs, bundle.join("rootfs"));
    assert_eq!(plan.args, ["sh", "-c", "echo hi"]);
    assert_eq!(plan.env, ["PATH=/bin", "FOO=bar"]);
    assert_eq!(plan.cwd, "/tmp");
    assert_eq!(plan.user, None);
    assert!(!plan.terminal);
    assert_eq!(
        plan.inputs,
        [(PathBuf::from("/srv/data"), "/data".to_owned())]
    );
    assert_eq!(plan.cpus, Some(2));
    assert_eq!(plan.memory_mib, Some(512));
    assert_eq!(plan.hostname.as_deref(), Some("f88863cd15b1"));
    assert_eq!(
        plan.rlimits.iter().map(rlimit).collect::<Vec<_>>(),
        [provm_guest_agent::Rlimit {
            resource: 7,
            soft: 1024,
            hard: 1024
        }]
    );
    assert!(plan.recorded());
    let warnings = read.warnings.join("\n");
    for field in [
        "process.capabilities",
        "mounts[1] (/proc)",
        "mounts[2] (/dev/pts)",
        "mounts[3] (/etc/hosts)",
        "mounts[4] (/sys/fs/cgroup)",
        "linux.namespaces",
        "linux.seccomp",
        "linux.resources",
    ] {
        assert!(
            warnings.contains(field),
            "no warning for {field}: {warnings}"
        );
    }
    // Set in the guest, not ignored.
    for field in ["rlimits", "hostname"] {
        assert!(
            !warnings.contains(field),
            "a warning for {field}: {warnings}"
        );
    }
}

#[test]
fn a_read_write_bind_is_a_volume_in_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = podman_like(dir.path(), |config| {
        config["mounts"][0]["options"] = serde_json::json!(["rbind"]);
    });
    let plan = read(&bundle).unwrap().plan;
    assert!(plan.inputs.is_empty());
    let data = (PathBuf::from("/srv/data"), "/data".to_owned());
    assert_eq!(plan.host_folders().collect::<Vec<_>>(), [&data]);
    assert_eq!(plan.volumes, [data]);
}

#[test]
fn user_and_annotations_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = podman_like(dir.path(), |config| {
        config["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 100});
        config["process"]["terminal"] = true.into();
        config["annotations"][RECORD_ANNOTATION] = "false".into();
    });
    let plan = read(&bundle).unwrap().plan;
    assert_eq!(plan.user.as_deref(), Some("1000:100"));
    assert!(plan.terminal);
    assert!(!plan.recorded());
}

/// A change made to the Podman-like config.json.
type Edit = dyn Fn(&mut serde_json::Value);

/// Each refusal names the field (or file) that caused it.
#[test]
fn what_a_vm_cannot_honour_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Box<Edit>, &str)> = vec![
        (
            Box::new(|c| {
                c["mounts"][0]["type"] = "nfs".into();
                c["mounts"][0]["options"] = serde_json::json!(["ro"]);
            }),
            "mounts[0] (/data)",
        ),
        (
            Box::new(|c| {
                c["linux"]["devices"] = serde_json::json!([{"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232}])
            }),
            "linux.devices",
        ),
        (
            Box::new(|c| c["linux"]["resources"]["memory"]["limit"] = (16u64 << 20).into()),
            "linux.resources.memory.limit",
        ),
        (
            Box::new(|c| c["linux"]["resources"]["cpu"]["quota"] = 10_000_000.into()),
            "linux.resources.cpu",
        ),
        (
            Box::new(|c| c["process"]["args"] = serde_json::json!([])),
            "process.args",
        ),
        (
            Box::new(|c| c["process"]["cwd"] = "tmp".into()),
            "process.cwd",
        ),
        (
            Box::new(|c| c["root"]["path"] = "missing".into()),
            "root.path",
        ),
        (
            Box::new(|c| c["ociVersion"] = "2.0.0".into()),
            "ociVersion is \"2.0.0\"",
        ),
    ];
    for (edit, field) in cases {
        let case = tempfile::tempdir_in(dir.path()).unwrap();
        let bundle = podman_like(case.path(), edit);
        let error = read(&bundle).expect_err(field);
        assert!(error.contains(field), "{field}: {error}");
    }
}

#[test]
fn a_missing_bundle_or_config_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    let error = read(&missing).unwrap_err();
    assert!(
        error.contains("nowhere") && error.contains("--bundle"),
        "{error}"
    );
    let error = read(dir.path()).unwrap_err();
    assert!(error.contains("config.json"), "{error}");
}
