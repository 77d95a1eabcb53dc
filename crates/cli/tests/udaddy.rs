//! `softrdma udaddy` against itself over loopback: UD QPs found through SIDR, messages both
//! ways, each checked (length, the immediate naming the sender's QPN, the pattern).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

use softrdma::roce::RoceConfig;

#[test]
fn server_and_client_exchange_verified_messages() {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let ips = [1, 2].map(|l| IpAddr::V4(Ipv4Addr::new(127, 0, 0, l)));
    let port = RoceConfig::sharing_a_port(&ips).unwrap()[0]
        .port
        .to_string();
    let mut server = Command::new(bin)
        .args(["udaddy", "-b", "127.0.0.1", "-C", "20", "-S", "1000", "-V"])
        .args(["--port", "0", "--roce-port", &port, "--timeout", "30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let listen = loop {
        let l = lines.next().expect("server output ended").unwrap();
        if let Some(a) = l.strip_prefix("udaddy: listening on ") {
            break a.rsplit(':').next().unwrap().to_string();
        }
    };
    let client = Command::new(bin)
        .args([
            "udaddy",
            "-s",
            "127.0.0.1",
            "-b",
            "127.0.0.2",
            "-C",
            "20",
            "-S",
            "1000",
            "-V",
        ])
        .args(["--port", &listen, "--roce-port", &port, "--timeout", "30"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(out.contains("data transfers complete"), "{out}");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(server.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter().any(|l| l == "data transfers complete"),
        "{rest:?}"
    );
}
