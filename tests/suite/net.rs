//! The guest's network (`--net`), end to end: a host HTTP server on
//! 127.0.0.1 serves a file, the guest downloads it through the NAT's
//! gateway (busybox wget) and prints its digest; the recording replays
//! with the server stopped, and with no network at all. A name is resolved
//! through the guest's resolver by a name server the test runs (`--dns`),
//! and the recording replays with that server stopped too. A connection
//! nobody answers fails at once with the fix said; without `--net` the
//! guest has no network card, and `--dns` is refused.

use crate::common;

use common::{
    assert_replay_matches, images, incompressible, one_guest_at_a_time, path, provm, trace_path,
    FileServer,
};
use sha2::{Digest, Sha256};
use simple_dns::rdata::{RData, A};
use simple_dns::{Packet, PacketFlag, ResourceRecord, CLASS, QTYPE, TYPE};
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// 1 MiB: 16 of the guest's 64 KiB frames, several TCP windows' worth (3 MiB
/// took 43 s of the PVM tests, where the guest kernel's copies are emulated).
const FILE_LEN: usize = 1 << 20;

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

/// A made-up name, which only the test's name server knows.
const NAME: &str = "data.provm.test";

/// A name server on the host's 127.0.0.1 that answers `NAME`'s address
/// queries with the gateway's address (the host, as the guest sees it),
/// its other queries with no address, and other names with NXDOMAIN.
struct NameServer {
    port: u16,
    answered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NameServer {
    fn start() -> NameServer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let port = socket.local_addr().unwrap().port();
        let (answered, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (counted, stopped) = (answered.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buffer = [0u8; 512];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                    continue;
                };
                let Ok(query) = Packet::parse(&buffer[..len]) else {
                    continue;
                };
                let _ = socket.send_to(&answer(&query), from);
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        NameServer {
            port,
            answered,
            stop,
            thread: Some(thread),
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
    }
}

/// The answer to `query`: its questions, and an address for `NAME`'s.
fn answer(query: &Packet) -> Vec<u8> {
    let mut reply = Packet::new_reply(query.id());
    reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
    if query.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    for question in &query.questions {
        reply.questions.push(question.clone());
        let name = question.qname.to_string();
        if name != NAME {
            *reply.rcode_mut() = simple_dns::RCODE::NameError;
        } else if question.qtype == QTYPE::TYPE(TYPE::A) {
            let gateway = u32::from(Ipv4Addr::new(10, 0, 2, 2));
            reply.answers.push(ResourceRecord::new(
                question.qname.clone(),
                CLASS::IN,
                60,
                RData::A(A { address: gateway }),
            ));
        }
    }
    reply.build_bytes_vec().unwrap()
}

#[test]
fn a_download_by_name_replays_with_the_name_server_and_the_server_stopped() {
    let _guest = one_guest_at_a_time();
    let body = incompressible(256 << 10);
    let digest = provm_trace::hex(&Sha256::digest(&body));
    let server = FileServer::serving(body);
    let names = NameServer::start();
    let script = format!(
        "cat /etc/resolv.conf; {}",
        fetch_and_digest(&format!("http://{NAME}:{}/file", server.port))
    );
    let trace = trace_path(&common::scratch(module_path!()), "net-name");
    let recorded = provm(&[
        "record",
        "--net",
        "--dns",
        &names.address(),
        "-o",
        path(&trace),
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    eprintln!("recorded:\n{}{}", recorded.stdout, recorded.stderr);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(
        recorded.stdout,
        format!("nameserver 10.0.2.3\n{digest}  -\n")
    );
    assert!(names.answered() > 0, "the name server was not asked");
    names.stop();
    server.stop();

    let replayed = assert_replay_matches(&trace);
    eprintln!("replayed, with the name server and the server stopped:\n{replayed}");
}

#[test]
fn dns_needs_net_and_an_address_with_a_port() {
    let image = path(&images().tiny_qcow2);
    let without_net = provm(&["run", "--dns", "127.0.0.1:53", image, "--", "true"]);
    assert_ne!(without_net.status, 0);
    assert!(
        without_net.stderr.contains("--net"),
        "{}",
        without_net.stderr
    );
    let unparsable = provm(&["run", "--net", "--dns", "localhost", image, "--", "true"]);
    assert_ne!(unparsable.status, 0);
    assert!(
        unparsable
            .stderr
            .contains("\"localhost\" is not HOST:PORT with HOST an IP address"),
        "{}",
        unparsable.stderr
    );
}
