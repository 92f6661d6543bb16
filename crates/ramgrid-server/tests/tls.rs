//! TLS over real sockets (docs/tls.md): the cluster client's round trip and `stats` over TLS,
//! client certificates required and refused, a TLS client on a plain port and a plain client on
//! a TLS port failing at once, and bad certificate files refused at start. The certificates come
//! from `scripts/tls-test-certs.sh` (the openssl CLI), made once per test into its own directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ramgrid_client::{Client, ClientConfig, ErrorKind, Keys, TlsConfig, ValueType, ValuesRef};
use ramgrid_server::{start, Config, ServerHandle};

fn certs(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ramgrid-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/tls-test-certs.sh");
    let ok = std::process::Command::new("bash")
        .arg(script)
        .arg(&dir)
        .status()
        .expect("run scripts/tls-test-certs.sh (needs the openssl CLI: make setup installs it)");
    assert!(ok.success(), "scripts/tls-test-certs.sh failed");
    dir
}

fn config(dir: &Path, extra: &[&str]) -> Config {
    let cert = dir.join("server.pem");
    let key = dir.join("server.key");
    let mut args: Vec<String> = [
        "ramgrid-server",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--memory",
        "16MiB",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Config::parse_from(args)
}

fn server(dir: &Path, extra: &[&str]) -> ServerHandle {
    start(&config(dir, extra)).expect("TLS server starts")
}

fn client(h: &ServerHandle, tls: Option<TlsConfig>) -> Client {
    let mut c = ClientConfig::new(vec![h.local_addr().to_string()]);
    c.tls = tls;
    // Long: a refusal must come from the server's answer, never from a timeout (the tests check
    // the error's kind rather than the time taken).
    c.timeout = Duration::from_secs(30);
    c.call_timeout = Duration::from_secs(60);
    Client::new(c).expect("client")
}

fn tls(dir: &Path, client_cert: Option<&str>) -> TlsConfig {
    TlsConfig {
        ca: dir.join("ca.pem"),
        cert: client_cert.map(|c| dir.join(format!("{c}.pem"))),
        key: client_cert.map(|c| dir.join(format!("{c}.key"))),
        server_name: None,
    }
}

/// Creates a table, writes and reads back through `c`.
fn round_trip(c: &Client) -> ramgrid_client::Result<()> {
    c.push_spec()?;
    c.create_table("w", 8, 1, ValueType::F64)?;
    c.put(
        "w",
        Keys::I64(&[1, 2, 3]),
        ValuesRef::F64(&[0.5, 1.5, 2.5]),
        0,
    )?;
    let got = c.get("w", Keys::I64(&[3, 4]), 0)?;
    assert_eq!(got.found, [true, false]);
    Ok(())
}

#[test]
fn the_cluster_client_round_trips_over_tls() {
    let dir = certs("round");
    let h = server(&dir, &[]);
    let c = client(&h, Some(tls(&dir, None)));
    round_trip(&c).expect("round trip over TLS");
    // `stats` goes over the memcached text protocol on the same TLS port.
    let stats = c.server_stats();
    let (_, s) = &stats[0];
    let s = s.as_ref().expect("stats over TLS");
    assert!(s.iter().any(|(k, _)| k == "curr_connections"));
    // A plain client on the TLS port fails at once, and the server keeps serving.
    let plain = client(&h, None);
    let e = plain.push_spec().expect_err("a plain client on a TLS port");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(e.to_string().contains("TLS alert"), "{e}");
    c.put("w", Keys::I64(&[5]), ValuesRef::F64(&[5.0]), 0)
        .expect("still serving TLS clients");
    h.shutdown();
}

#[test]
fn a_tls_client_on_a_plain_port_fails_at_once() {
    let dir = certs("plainport");
    let h = start(&Config::for_tests()).expect("plain server");
    let c = client(&h, Some(tls(&dir, None)));
    let e = c.push_spec().expect_err("TLS client on a plain port");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed, "{e}");
    assert!(e.to_string().contains("TLS handshake"), "{e}");
    // The server is unharmed.
    round_trip(&client(&h, None)).expect("plain clients still served");
    h.shutdown();
}

#[test]
fn client_certificates_when_required() {
    let dir = certs("mtls");
    let ca = dir.join("ca.pem");
    let h = server(&dir, &["--tls-client-ca", ca.to_str().unwrap()]);
    let e = client(&h, Some(tls(&dir, None)))
        .push_spec()
        .expect_err("no client certificate");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed, "{e}");
    let e = client(&h, Some(tls(&dir, Some("other-client"))))
        .push_spec()
        .expect_err("a client certificate from another CA");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed, "{e}");
    round_trip(&client(&h, Some(tls(&dir, Some("client"))))).expect("the right certificate");
    assert!(h.shared().sum(|w| &w.tls_handshake_failures) >= 2);
    h.shutdown();
}

#[test]
fn the_client_refuses_a_server_its_ca_did_not_sign() {
    let dir = certs("wrongca");
    let h = server(&dir, &[]);
    let mut t = tls(&dir, None);
    t.ca = dir.join("other-ca.pem");
    let e = client(&h, Some(t)).push_spec().expect_err("unknown issuer");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed, "{e}");
    // A name the certificate does not carry.
    let mut t = tls(&dir, None);
    t.server_name = Some("elsewhere.example".into());
    let e = client(&h, Some(t)).push_spec().expect_err("wrong name");
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed, "{e}");
    h.shutdown();
}

#[test]
fn bad_certificate_files_stop_the_start() {
    let dir = certs("badfiles");
    std::fs::write(dir.join("garbage.pem"), "not a certificate\n").unwrap();
    type Set = fn(&mut Config, PathBuf);
    let cases: [(Set, &str, &str); 5] = [
        (|c, p| c.tls_cert = Some(p), "missing.pem", "missing.pem"),
        (
            |c, p| c.tls_cert = Some(p),
            "garbage.pem",
            "no PEM certificate",
        ),
        (
            |c, p| c.tls_key = Some(p),
            "garbage.pem",
            "no PEM private key",
        ),
        // The client's key does not match the server's certificate.
        (|c, p| c.tls_key = Some(p), "client.key", "server.pem"),
        (
            |c, p| c.tls_client_ca = Some(p),
            "garbage.pem",
            "--tls-client-ca",
        ),
    ];
    for (set, file, want) in cases {
        let mut c = config(&dir, &[]);
        set(&mut c, dir.join(file));
        let e = start(&c).err().expect("refused at start");
        let msg = format!("{e:#}");
        assert!(msg.contains(want), "{file}: {msg}");
    }
    let mut c = Config::for_tests();
    c.tls_cert = Some(dir.join("server.pem"));
    let e = start(&c).err().expect("a certificate without its key");
    assert!(format!("{e:#}").contains("go together"), "{e:#}");
    // A client's own files are checked when it is made.
    let mut cc = ClientConfig::new(vec!["127.0.0.1:1".into()]);
    cc.tls = Some(TlsConfig {
        ca: dir.join("garbage.pem"),
        ..TlsConfig::default()
    });
    let Err(e) = Client::new(cc) else {
        panic!("a bad CA file was accepted")
    };
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}
