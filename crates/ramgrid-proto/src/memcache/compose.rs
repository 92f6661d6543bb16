//! The request composer: the inverse of the parser, used by tests, the fuzz targets and the load
//! generator. `parse_request(compose_request(r)) == r` for every request the parser can return.

use super::reply::{push_i64, push_u64};
use super::request::{Meta, Request, Store, StoreMode};

/// Appends the wire form of `req` (command line, CRLF, and any data block with its CRLF) to `out`.
pub fn compose_request(req: &Request<'_>, out: &mut Vec<u8>) {
    match req {
        Request::Get { keys, with_cas } => {
            out.extend_from_slice(if *with_cas { b"gets" } else { b"get" });
            for key in keys {
                out.push(b' ');
                out.extend_from_slice(key);
            }
        }
        Request::Gat {
            exptime,
            keys,
            with_cas,
        } => {
            out.extend_from_slice(if *with_cas { b"gats " } else { b"gat " });
            push_i64(out, *exptime);
            for key in keys {
                out.push(b' ');
                out.extend_from_slice(key);
            }
        }
        Request::Store(store) => return compose_store(store, out),
        Request::Delete { key, noreply } => {
            word_line(out, b"delete", key);
            noreply_suffix(out, *noreply);
        }
        Request::Arith {
            key,
            delta,
            incr,
            noreply,
        } => {
            word_line(out, if *incr { b"incr" } else { b"decr" }, key);
            out.push(b' ');
            push_u64(out, *delta);
            noreply_suffix(out, *noreply);
        }
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            word_line(out, b"touch", key);
            out.push(b' ');
            push_i64(out, *exptime);
            noreply_suffix(out, *noreply);
        }
        Request::FlushAll { delay, noreply } => {
            out.extend_from_slice(b"flush_all");
            if let Some(delay) = delay {
                out.push(b' ');
                push_i64(out, *delay);
            }
            noreply_suffix(out, *noreply);
        }
        Request::Stats { arg } => {
            out.extend_from_slice(b"stats");
            if let Some(arg) = arg {
                out.push(b' ');
                out.extend_from_slice(arg);
            }
        }
        Request::Version => out.extend_from_slice(b"version"),
        Request::Verbosity { level, noreply } => {
            out.extend_from_slice(b"verbosity ");
            push_u64(out, u64::from(*level));
            noreply_suffix(out, *noreply);
        }
        Request::Quit => out.extend_from_slice(b"quit"),
        Request::MetaGet(meta) => meta_line(out, b"mg", meta, None),
        Request::MetaSet { meta, data } => {
            meta_line(out, b"ms", meta, Some(data.len()));
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(data);
        }
        Request::MetaDelete(meta) => meta_line(out, b"md", meta, None),
        Request::MetaArith(meta) => meta_line(out, b"ma", meta, None),
        Request::MetaNoop => out.extend_from_slice(b"mn"),
        Request::MetaDebug { key } => {
            word_line(out, b"me", key.raw);
            if key.base64 {
                out.extend_from_slice(b" b");
            }
        }
    }
    out.extend_from_slice(b"\r\n");
}

fn compose_store(store: &Store<'_>, out: &mut Vec<u8>) {
    word_line(out, store.mode.command().as_bytes(), store.key);
    out.push(b' ');
    push_u64(out, u64::from(store.flags));
    out.push(b' ');
    push_i64(out, store.exptime);
    out.push(b' ');
    push_u64(out, store.data.len() as u64);
    if let StoreMode::Cas(unique) = store.mode {
        out.push(b' ');
        push_u64(out, unique);
    }
    noreply_suffix(out, store.noreply);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(store.data);
    out.extend_from_slice(b"\r\n");
}

fn word_line(out: &mut Vec<u8>, cmd: &[u8], key: &[u8]) {
    out.extend_from_slice(cmd);
    out.push(b' ');
    out.extend_from_slice(key);
}

fn noreply_suffix(out: &mut Vec<u8>, noreply: bool) {
    if noreply {
        out.extend_from_slice(b" noreply");
    }
}

fn meta_line(out: &mut Vec<u8>, cmd: &[u8], meta: &Meta<'_>, datalen: Option<usize>) {
    word_line(out, cmd, meta.key.raw);
    if let Some(len) = datalen {
        out.push(b' ');
        push_u64(out, len as u64);
    }
    let flags = meta.flags.as_bytes();
    if !flags.is_empty() {
        out.push(b' ');
        out.extend_from_slice(flags);
    }
}
