//! Fuzzes the shared-memory handshake (crates/ramgrid-proto/src/shm.rs, docs/shared-memory.md:
//! what a server reads from a client's Unix socket, and a client from the server's):
//! arbitrary bytes as a message body go to `Request::decode` and `Reply::decode`, and the first
//! four as a length prefix to `body_len`. Nothing may panic, and the encoding is canonical: a
//! message that decodes encodes to exactly its length prefix and the same body bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_proto::shm::{body_len, Reply, Request, MAX_BODY};

fn framed_as(encoded: &[u8], body: &[u8]) {
    assert_eq!(
        &encoded[..4],
        &(body.len() as u32).to_le_bytes(),
        "length prefix"
    );
    assert_eq!(
        &encoded[4..],
        body,
        "a decoded message encoded to other bytes"
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        framed_as(&req.encode(), data);
    }
    if let Ok(rep) = Reply::decode(data) {
        framed_as(&rep.encode(), data);
    }
    if let Some(prefix) = data.get(..4) {
        let n = u32::from_le_bytes(prefix.try_into().unwrap()) as usize;
        assert_eq!(
            body_len(prefix.try_into().unwrap()).ok(),
            (n <= MAX_BODY).then_some(n)
        );
    }
});
