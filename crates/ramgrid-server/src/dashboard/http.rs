//! The dashboard's HTTP side: which requests it answers, who may see them, and the replies.
//!
//! `GET /` is the page (HTML with its script and style inlined, all embedded in the binary);
//! `GET /api/{cluster,tables,series,events}` the JSON documents of `api.rs`. With a token, both
//! need `Authorization: Bearer <token>`: a request without it gets `401` and, for the page, a
//! small login page whose script takes the token from a form or from the URL's fragment
//! (`#token=...`, which browsers never send to the server), then loads the page with the header.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use super::Dashboard;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");
const LOGIN: &str = include_str!("assets/login.html");

/// Inline scripts and styles only, requests to this origin only: the page loads nothing else.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; form-action 'none'; frame-ancestors 'none'";

/// The headers of every dashboard reply beyond those of any reply (`crate::http` writes both).
pub const HEADERS: [(&str, &str); 4] = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Content-Security-Policy", CSP),
];

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The dashboard page.
    Index,
    /// One of the JSON documents.
    Api(Doc),
    /// Anything else.
    NotFound,
}

/// The JSON documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    /// `/api/cluster`.
    Cluster,
    /// `/api/tables`.
    Tables,
    /// `/api/series`.
    Series,
    /// `/api/events`.
    Events,
}

/// Whether a request may see the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token is configured and the listener is on loopback.
    Open,
    /// The request bears the token.
    Granted,
    /// A token is configured and the request does not bear it: 401.
    Refused,
    /// No token is configured and the listener is reachable from other hosts: 403, never served.
    NeedsToken,
}

/// The page a request path names (the query string is ignored).
pub fn page(target: &str) -> Page {
    match target.split('?').next().unwrap_or_default() {
        "/" | "/index.html" => Page::Index,
        "/api/cluster" => Page::Api(Doc::Cluster),
        "/api/tables" => Page::Api(Doc::Tables),
        "/api/series" => Page::Api(Doc::Series),
        "/api/events" => Page::Api(Doc::Events),
        _ => Page::NotFound,
    }
}

/// The bearer token of a request head's `Authorization` header, if any.
pub fn bearer(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    })
}

/// The `Host` header of a request head, if any.
pub fn host(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    })
}

/// Whether `host` (a `Host` header) names this machine by address or as `localhost`. Without a
/// token this is what keeps a web page whose name was re-pointed at 127.0.0.1 (DNS rebinding)
/// from reading the dashboard as its own origin.
pub fn local_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Who may see the dashboard: the token's holders when there is one, else anyone on a
/// loopback listener, else no one.
pub fn access(token: Option<&str>, presented: Option<&str>, bind: SocketAddr) -> Access {
    match (token, presented) {
        (Some(t), Some(p)) if crate::auth::token_matches(p.as_bytes(), t) => Access::Granted,
        (Some(_), _) => Access::Refused,
        (None, _) if bind.ip().is_loopback() => Access::Open,
        (None, _) => Access::NeedsToken,
    }
}

/// The page, assembled once.
fn index() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        INDEX
            .replace("/*STYLE*/", STYLE)
            .replace("/*SCRIPT*/", SCRIPT)
    })
}

/// The answer (status, content type, body) to a request for `target` whose head (request line
/// and headers) is `head`; sent with [`HEADERS`].
pub async fn answer(
    target: &str,
    head: &str,
    dash: &Arc<Dashboard>,
) -> (&'static str, &'static str, Cow<'static, str>) {
    let page = page(target);
    if page == Page::NotFound {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the dashboard is at /, the metrics at /metrics\n".into(),
        )
    } else {
        match (access(dash.token(), bearer(head), dash.bind), page) {
            (Access::NeedsToken, _) => (
                "403 Forbidden",
                "text/plain; charset=utf-8",
                "the dashboard is served off loopback only with a token: start the server with \
                 --token (RAMGRID_TOKEN)\n"
                    .into(),
            ),
            (Access::Open, _) if !host(head).is_some_and(local_host) => (
                "403 Forbidden",
                "text/plain; charset=utf-8",
                "without a token the dashboard answers only requests to an IP address or \
                 localhost (Host header)\n"
                    .into(),
            ),
            (Access::Refused, Page::Index) => {
                ("401 Unauthorized", "text/html; charset=utf-8", LOGIN.into())
            }
            (Access::Refused, _) => (
                "401 Unauthorized",
                "application/json",
                "{\"error\":\"this server needs its token: Authorization: Bearer <token>\"}".into(),
            ),
            (_, Page::Index) => ("200 OK", "text/html; charset=utf-8", index().into()),
            (_, Page::Api(doc)) => {
                dash.watch().await;
                let now = super::unix_ms();
                let v = dash.with_state(|st, me| match doc {
                    Doc::Cluster => super::api::cluster(st, me, now),
                    Doc::Tables => super::api::tables(st),
                    Doc::Series => super::api::series(st),
                    Doc::Events => super::api::events(st),
                });
                ("200 OK", "application/json", v.to_string().into())
            }
            (_, Page::NotFound) => unreachable!("answered above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages() {
        assert_eq!(page("/"), Page::Index);
        assert_eq!(page("/?x=1"), Page::Index);
        assert_eq!(page("/api/cluster"), Page::Api(Doc::Cluster));
        assert_eq!(page("/api/events?since=3"), Page::Api(Doc::Events));
        assert_eq!(page("/api/nope"), Page::NotFound);
        assert_eq!(page("/dashboard.js"), Page::NotFound);
    }

    #[test]
    fn the_bearer_token_is_read_from_its_header_only() {
        let head = "GET / HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer s3cret \r\n\r\n";
        assert_eq!(bearer(head), Some("s3cret"));
        assert_eq!(
            bearer("GET /Authorization: Bearer x HTTP/1.1\r\n\r\n"),
            None
        );
        assert_eq!(
            bearer("GET / HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n"),
            None
        );
    }

    #[test]
    fn only_addresses_and_localhost_pass_without_a_token() {
        assert_eq!(
            host("GET / HTTP/1.1\r\nhOsT: 127.0.0.1:9\r\n\r\n"),
            Some("127.0.0.1:9")
        );
        assert_eq!(host("GET / HTTP/1.1\r\n\r\n"), None);
        for ok in [
            "127.0.0.1:9100",
            "127.0.0.1",
            "localhost:80",
            "[::1]:9100",
            "10.1.2.3",
        ] {
            assert!(local_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:9100",
            "evil.example",
            "127.0.0.1.evil.example:1",
            "",
        ] {
            assert!(!local_host(bad), "{bad}");
        }
    }

    #[test]
    fn who_may_see_the_dashboard() {
        let lo: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let all: SocketAddr = "0.0.0.0:9000".parse().unwrap();
        assert_eq!(access(None, None, lo), Access::Open);
        assert_eq!(access(None, Some("x"), all), Access::NeedsToken);
        assert_eq!(access(Some("t"), Some("t"), all), Access::Granted);
        assert_eq!(access(Some("t"), None, lo), Access::Refused);
        assert_eq!(access(Some("t"), Some("u"), lo), Access::Refused);
    }

    #[test]
    fn the_page_is_one_document_with_its_script_and_style() {
        let p = index();
        assert!(!p.contains("/*SCRIPT*/") && !p.contains("/*STYLE*/"));
        assert!(p.contains("/api/cluster"));
        // Nothing is loaded from elsewhere.
        for bad in ["http://", "https://", "src=\"//", "<link"] {
            assert!(!p.contains(bad), "{bad}");
            assert!(!LOGIN.contains(bad), "{bad}");
        }
    }
}
