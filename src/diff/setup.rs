//! What two runs were asked to do, from their manifests: the command, its
//! environment and data, the image, the kernel and the machine. Where these
//! differ, the runs are not two runs of one command, and that comes first.

use std::collections::BTreeSet;

use provm_trace::manifest::Manifest;

/// One thing the two runs were given differently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub what: &'static str,
    pub first: String,
    pub second: String,
}

/// What differs between the runs' manifests, in the order a reader asks:
/// the command, then what it ran on.
pub fn differences(first: &Manifest, second: &Manifest) -> Vec<Difference> {
    let mut found = Vec::new();
    let mut compare = |what, of: &dyn Fn(&Manifest) -> String| {
        let (a, b) = (of(first), of(second));
        if a != b {
            found.push(Difference {
                what,
                first: a,
                second: b,
            });
        }
    };
    compare("command", &|m| format!("{:?}", m.argv));
    compare("working directory", &|m| m.cwd.clone());
    compare("user", &|m| m.user.clone().unwrap_or_else(|| "root".into()));
    compare("input data", &|m| {
        let trees = m
            .inputs
            .iter()
            .map(|i| format!("{} sha256 {}", i.guest, i.sha256));
        let disk = m
            .input_disk
            .iter()
            .map(|d| format!("input disk sha256 {}", d.sha256));
        let stdin = m.stdin.iter().map(|s| format!("stdin sha256 {}", s.sha256));
        listed(trees.chain(disk).chain(stdin))
    });
    compare("outputs asked for", &|m| listed(m.outputs.iter().cloned()));
    compare("image", &|m| {
        listed(
            m.image
                .chain
                .iter()
                .map(|file| format!("sha256 {}", file.sha256)),
        )
    });
    compare("kernel", &|m| format!("sha256 {}", m.kernel_sha256));
    compare("agent (initramfs)", &|m| {
        format!("sha256 {}", m.initramfs_sha256)
    });
    compare("kernel command line", &|m| m.kernel_cmdline.clone());
    compare("memory", &|m| format!("{} MiB", m.memory_mib));
    compare("vCPUs", &|m| m.cpus.to_string());
    compare("CPU model", &|m| {
        let baseline = m.cpu.baseline.as_deref().unwrap_or("host");
        format!("{baseline}, {} CPUID entries", m.cpu.cpuid.len())
    });
    compare("machine version", &|m| m.machine_version.to_string());
    // The environment last: it is long, so only the entries that differ.
    let (env_a, env_b) = (env(first), env(second));
    if env_a != env_b {
        found.push(Difference {
            what: "environment",
            first: listed(env_a.difference(&env_b).map(|e| e.to_string())),
            second: listed(env_b.difference(&env_a).map(|e| e.to_string())),
        });
    }
    found
}

fn env(manifest: &Manifest) -> BTreeSet<&str> {
    manifest.env.iter().map(String::as_str).collect()
}

/// `items` joined, or "none".
fn listed(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A manifest of `argv` with `env`, on a small machine: a fake, read
    /// from the form traces keep.
    pub fn manifest(argv: &[&str], env: &[&str]) -> Manifest {
        serde_json::from_value(serde_json::json!({
            "provm_version": "0.1.0",
            "machine_version": 1,
            "started_unix": 0,
            "argv": argv,
            "env": env,
            "cwd": "/",
            "root_device": "/dev/vda",
            "image": { "path": "tiny.qcow2", "chain": [{
                "path": "tiny.qcow2", "depth": 0, "role": "image",
                "size": 1, "sha256": "aa" }] },
            "kernel_sha256": "bb",
            "kernel_profile_sha256": "cc",
            "initramfs_sha256": "dd",
            "snapshot_sha256": "ee",
            "kernel_cmdline": "console=ttyS0",
            "memory_mib": 128,
            "cpus": 1,
            "cpu": { "cpuid": [], "ignored_by_kernel": [] },
            "host": { "kernel": "6.1", "cpu": "EPYC", "hypervisor": "PVM" },
        }))
        .expect("a manifest")
    }

    #[test]
    fn the_same_command_on_the_same_machine_has_no_differences() {
        let run = manifest(&["date"], &["PATH=/bin"]);
        assert_eq!(differences(&run, &run.clone()), []);
    }

    #[test]
    fn differences_name_the_command_first_and_only_the_env_entries_that_differ() {
        let first = manifest(&["date"], &["PATH=/bin", "TZ=UTC"]);
        let mut second = manifest(&["date", "-u"], &["PATH=/bin", "TZ=CET"]);
        second.memory_mib = 256;
        second.image.chain[0].sha256 = "ff".into();
        let found = differences(&first, &second);
        let whats: Vec<&str> = found.iter().map(|d| d.what).collect();
        assert_eq!(whats, ["command", "image", "memory", "environment"]);
        assert_eq!(found[0].second, r#"["date", "-u"]"#);
        assert_eq!(found[1].first, "sha256 aa");
        assert_eq!(
            (found[3].first.as_str(), found[3].second.as_str()),
            ("TZ=UTC", "TZ=CET")
        );
    }
}
