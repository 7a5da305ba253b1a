//! The guest's network (`--net`), end to end: a host HTTP server on
//! 127.0.0.1 serves a file, the guest downloads it through the NAT's
//! gateway (busybox wget) and prints its digest; the recording replays
//! with the server stopped, and with no network at all. A connection
//! nobody answers fails at once with the fix said; without `--net` the
//! guest has no network card.

use crate::common;

use common::{
    assert_replay_matches, images, incompressible, one_guest_at_a_time, path, provm, trace_path,
    FileServer,
};
use sha2::{Digest, Sha256};

/// 3 MiB: several window's worth of the guest's 64 KiB frames.
const FILE_LEN: usize = 3 << 20;

fn fetch_and_digest(url: &str) -> String {
    format!("wget -q -O - {url} | sha256sum")
}

#[test]
fn a_download_through_the_nat_replays_with_the_server_stopped() {
    let _guest = one_guest_at_a_time();
    let body = incompressible(FILE_LEN);
    let digest = provm_trace::hex(&Sha256::digest(&body));
    let server = FileServer::serving(body);
    let image = path(&images().tiny_qcow2);
    let script = fetch_and_digest(&server.guest_url());

    let ran = provm(&["run", "--net", image, "--", "/bin/sh", "-c", &script]);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    assert_eq!(ran.stdout, format!("{digest}  -\n"));

    let trace = trace_path(&common::scratch(module_path!()), "net-download");
    let recorded = provm(&[
        "record",
        "--net",
        "-o",
        path(&trace),
        image,
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(recorded.stdout, format!("{digest}  -\n"));
    server.stop();

    assert_replay_matches(&trace);
    let inspect = provm(&["inspect", path(&trace)]);
    assert!(
        inspect.stdout.contains("net frame received"),
        "{}",
        inspect.stdout
    );
}

#[test]
fn a_connection_nobody_answers_fails_at_once_naming_the_fix() {
    let _guest = one_guest_at_a_time();
    let port = common::free_port();
    let script = fetch_and_digest(&format!("http://10.0.2.2:{port}/file"));
    let ran = provm(&[
        "run",
        "--net",
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        &format!("{script}; wget -q -O /dev/null http://10.0.2.2:{port}/; echo wget $?"),
    ]);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    assert!(ran.stdout.ends_with("wget 1\n"), "{}", ran.stdout);
    assert!(
        ran.stderr.contains(&format!(
            "network: the guest's connection to 10.0.2.2:{port} failed"
        )) && ran.stderr.contains(&format!(
            "start the server on the host first, listening on 127.0.0.1:{port}"
        )),
        "{}",
        ran.stderr
    );
}

#[test]
fn without_net_the_guest_has_no_network_card() {
    let _guest = one_guest_at_a_time();
    let ran = provm(&[
        "run",
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        "ls /sys/class/net; wget -q -O /dev/null http://10.0.2.2:1/; echo wget $?",
    ]);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    assert_eq!(ran.stdout, "lo\nwget 1\n", "{}", ran.stderr);
}
