//! Fuzzes the native frame parser and the request/response body decoders: arbitrary bytes, read as
//! a connection would read them (frame after frame), must never panic, a frame must never claim
//! more bytes than it was given, and whatever decodes must re-encode to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_proto::native::{
    parse_frame, FrameError, Request, Response, FLAG_ACK_ONE, FLAG_REPLICA,
};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    loop {
        match parse_frame(rest, 1 << 16) {
            Ok((frame, used)) => {
                assert!(used <= rest.len() && used >= 16, "frame used {used} of {} bytes", rest.len());
                if frame.is_response() {
                    let _ = Response::decode(&frame);
                } else if let Ok(req) = Request::decode(&frame) {
                    // A request that decodes re-encodes to exactly the bytes it came from, but for
                    // the flags a PUT or DELETE may carry (the frame's, not the body's).
                    let mut out = Vec::new();
                    req.encode(&mut out, frame.request_id).expect("a decoded request re-encodes");
                    let mut want = rest[..used].to_vec();
                    want[3] &= !(FLAG_REPLICA | FLAG_ACK_ONE);
                    assert_eq!(out, want, "decode then encode changed the frame");
                }
                rest = &rest[used..];
            }
            Err(FrameError::Incomplete { needed }) => {
                assert!(needed > rest.len(), "incomplete but needs only {needed} of {}", rest.len());
                break;
            }
            Err(_) => break,
        }
    }
});
