//! The shim's own command line, without containerd: `delete`, the cleanup
//! containerd asks of a shim that died, says where provm-runtime must be
//! when it cannot find it.

use std::process::Command;

#[test]
fn delete_names_the_missing_runtime_and_where_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    // A copy, so that no provm-runtime is beside it.
    let shim = dir.path().join("containerd-shim-provm-v1");
    std::fs::copy(env!("CARGO_BIN_EXE_containerd-shim-provm-v1"), &shim).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let output = Command::new(&shim)
        .args(["-namespace", "test", "-id", "gone", "delete"])
        .current_dir(&bundle)
        .env("PATH", dir.path().join("nothing"))
        .env("TTRPC_ADDRESS", dir.path().join("containerd.sock.ttrpc"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot run provm-runtime")
            && stderr.contains("install provm-runtime beside the shim or on the PATH"),
        "{stderr}"
    );
}
