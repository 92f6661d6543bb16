//! The HTTP listener of `--metrics ADDR`: `GET /metrics` is answered with the Prometheus
//! exposition of `metrics.rs`, any other GET by the dashboard (`dashboard/http.rs`).
//!
//! The listener runs on a thread of its own, so a slow scraper or browser never delays a worker.
//! Each connection sends one request of at most [`MAX_REQUEST`] bytes within [`READ_TIMEOUT`],
//! gets its answer and is closed.

use std::fmt::Write as _;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::dashboard::{self, Dashboard};
use crate::metrics;
use crate::node::Node;
use crate::stats::Shared;

/// The longest HTTP request the endpoint reads (request line and headers).
pub const MAX_REQUEST: usize = 8 << 10;
/// How long the endpoint waits for a whole request, and for its answer to be taken.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics` and the dashboard on `listener` from a thread of its own until `stop`
/// turns true.
pub fn spawn(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    node: Arc<Node>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    // The same listener serves the dashboard (docs/dashboard.md), whose sampler runs here too.
    let dash = Dashboard::new(node.clone(), shared.clone(), listener.local_addr()?);
    std::thread::Builder::new()
        .name("ramgrid-metrics".into())
        .spawn(move || {
            let Some(rt) = crate::server::thread_runtime("metrics") else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                tokio::spawn(dash.clone().run(stop.clone()));
                loop {
                    tokio::select! {
                        r = listener.accept() => {
                            let Ok((sock, _)) = r else { continue };
                            let (shared, node, dash) = (shared.clone(), node.clone(), dash.clone());
                            tokio::spawn(async move {
                                let _ = tokio::time::timeout(READ_TIMEOUT * 2, async {
                                    // With --tls-cert this listener speaks HTTPS, with the data
                                    // port's certificate and client-certificate rule.
                                    match node.tls.clone() {
                                        None => serve(sock, &shared, &node, &dash).await,
                                        Some(tls) => {
                                            if let Ok(s) = tls.acceptor.accept(sock).await {
                                                serve(s, &shared, &node, &dash).await;
                                            }
                                        }
                                    }
                                })
                                .await;
                            });
                        }
                        _ = stop.changed() => break,
                    }
                }
            });
        })
}

/// What an HTTP request asks for, from its head (request line and headers).
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    BadMethod,
    Bad,
}

fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with(b"HTTP/1.") || parts.next().is_some() {
        return Route::Bad;
    }
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match method {
        b"GET" | b"HEAD" if path == b"/metrics" => Route::Metrics {
            head_only: method == b"HEAD",
        },
        b"GET" | b"HEAD" => Route::NotFound,
        _ => Route::BadMethod,
    }
}

/// Reads one request head and answers it: `/metrics` here, any other GET by the dashboard.
async fn serve(
    mut sock: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    shared: &Shared,
    node: &Node,
    dash: &Arc<Dashboard>,
) {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut n = 0;
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            match sock.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => n += k,
            }
            let head = &buf[..n];
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return true;
            }
            if n == buf.len() {
                return false;
            }
        }
    })
    .await;
    let (code, body, head_only) = match complete {
        Ok(true) => match route(&buf[..n]) {
            Route::Metrics { head_only } => {
                let head = String::from_utf8_lossy(&buf[..n]);
                let presented = dashboard::http::bearer(&head);
                if metrics::metrics_allowed(node.token.as_deref(), presented, dash.bind) {
                    ("200 OK", metrics::render(shared, node), head_only)
                } else {
                    let why = "this server needs its token: Authorization: Bearer <token>\n";
                    ("401 Unauthorized", why.into(), false)
                }
            }
            Route::NotFound => {
                // Any other GET is the dashboard's (its page, its API, or its 404).
                let head = String::from_utf8_lossy(&buf[..n]);
                let target = head.split(' ').nth(1).unwrap_or("/");
                let head_only = head.starts_with("HEAD ");
                let (code, kind, body) = dashboard::http::answer(target, &head, dash).await;
                let headers = &dashboard::http::HEADERS;
                reply(&mut sock, code, kind, headers, &body, head_only).await;
                return;
            }
            Route::BadMethod => ("405 Method Not Allowed", "only GET\n".into(), false),
            Route::Bad => ("400 Bad Request", "bad request\n".into(), false),
        },
        // Too long, closed early or too slow.
        Ok(false) if n == buf.len() => {
            ("431 Request Header Fields Too Large", String::new(), false)
        }
        _ => return,
    };
    let kind = if code.starts_with("200") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let allow: &[(&str, &str)] = if code.starts_with("405") {
        &[("Allow", "GET, HEAD")]
    } else {
        &[]
    };
    reply(&mut sock, code, kind, allow, &body, head_only).await;
}

/// Writes one reply and closes the connection: the status line, `Content-Type`,
/// `Content-Length`, `Connection: close`, then `headers`, for a 401 the bearer challenge, and the
/// body unless `head_only` (a HEAD request).
async fn reply(
    sock: &mut (impl AsyncWrite + Unpin),
    code: &str,
    kind: &str,
    headers: &[(&str, &str)],
    body: &str,
    head_only: bool,
) {
    let mut reply = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(reply, "{name}: {value}\r\n");
    }
    if code.starts_with("401") {
        reply.push_str("WWW-Authenticate: Bearer realm=\"ramgrid\"\r\n");
    }
    reply.push_str("\r\n");
    if !head_only {
        reply.push_str(body);
    }
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        let _ = sock.write_all(reply.as_bytes()).await;
        let _ = sock.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /metricsx HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::BadMethod);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::Bad);
        assert_eq!(route(b"get k\r\n\r\n"), Route::Bad);
    }

    /// The bytes `reply` writes for `(code, kind, headers, body, head_only)`.
    fn written(code: &str, kind: &str, headers: &[(&str, &str)], body: &str, head: bool) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut out = Vec::new();
        rt.block_on(reply(&mut out, code, kind, headers, body, head));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_reply_has_the_common_headers_then_its_own_then_the_challenge() {
        let got = written(
            "405 Method Not Allowed",
            "text/plain",
            &[("Allow", "GET, HEAD")],
            "x\n",
            false,
        );
        assert_eq!(
            got,
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\
             Connection: close\r\nAllow: GET, HEAD\r\n\r\nx\n"
        );
        let got = written(
            "401 Unauthorized",
            "application/json",
            &[("Cache-Control", "no-store")],
            "{}",
            true,
        );
        assert_eq!(
            got,
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\
             Connection: close\r\nCache-Control: no-store\r\n\
             WWW-Authenticate: Bearer realm=\"ramgrid\"\r\n\r\n",
            "HEAD: the length of the body, not the body"
        );
    }
}
