//! Property tests of the codec: `parse(compose(r)) == r` for generated requests, alone and
//! pipelined, every strict prefix is `Incomplete`, and the parser invariants hold on noise.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::subsequence;

use super::invariants::{check_parse, check_stream};
use super::*;

/// Owned material for a request (requests borrow, so strategies produce this and tests build).
#[derive(Debug, Clone)]
enum Spec {
    Get {
        keys: Vec<Vec<u8>>,
        cas: bool,
    },
    Gat {
        exptime: i64,
        keys: Vec<Vec<u8>>,
        cas: bool,
    },
    Store {
        mode: StoreMode,
        key: Vec<u8>,
        flags: u32,
        exptime: i64,
        data: Vec<u8>,
        noreply: bool,
    },
    Delete {
        key: Vec<u8>,
        noreply: bool,
    },
    Arith {
        key: Vec<u8>,
        delta: u64,
        incr: bool,
        noreply: bool,
    },
    Touch {
        key: Vec<u8>,
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: Option<i64>,
        noreply: bool,
    },
    Stats {
        arg: Option<Vec<u8>>,
    },
    Version,
    Verbosity {
        level: u32,
        noreply: bool,
    },
    Quit,
    Meta {
        cmd: u8,
        key: Vec<u8>,
        base64: bool,
        flags: Vec<u8>,
        data: Vec<u8>,
    },
    MetaNoop,
    MetaDebug {
        key: Vec<u8>,
        base64: bool,
    },
}

impl Spec {
    fn build(&self) -> Request<'_> {
        match self {
            Spec::Get { keys, cas } => Request::Get {
                keys: Keys::new(keys_span(keys)),
                with_cas: *cas,
            },
            Spec::Gat { exptime, keys, cas } => Request::Gat {
                exptime: *exptime,
                keys: Keys::new(keys_span(keys)),
                with_cas: *cas,
            },
            Spec::Store {
                mode,
                key,
                flags,
                exptime,
                data,
                noreply,
            } => Request::Store(Store {
                mode: *mode,
                key,
                flags: *flags,
                exptime: *exptime,
                data,
                noreply: *noreply,
            }),
            Spec::Delete { key, noreply } => Request::Delete {
                key,
                noreply: *noreply,
            },
            Spec::Arith {
                key,
                delta,
                incr,
                noreply,
            } => Request::Arith {
                key,
                delta: *delta,
                incr: *incr,
                noreply: *noreply,
            },
            Spec::Touch {
                key,
                exptime,
                noreply,
            } => Request::Touch {
                key,
                exptime: *exptime,
                noreply: *noreply,
            },
            Spec::FlushAll { delay, noreply } => Request::FlushAll {
                delay: *delay,
                noreply: *noreply,
            },
            Spec::Stats { arg } => Request::Stats {
                arg: arg.as_deref(),
            },
            Spec::Version => Request::Version,
            Spec::Verbosity { level, noreply } => Request::Verbosity {
                level: *level,
                noreply: *noreply,
            },
            Spec::Quit => Request::Quit,
            Spec::Meta {
                cmd,
                key,
                base64,
                flags,
                data,
            } => {
                let meta = Meta {
                    key: MetaKey {
                        raw: key,
                        base64: *base64,
                    },
                    flags: MetaFlags::new(flags).expect("generated flags are valid"),
                };
                match cmd {
                    b'g' => Request::MetaGet(meta),
                    b'd' => Request::MetaDelete(meta),
                    b'a' => Request::MetaArith(meta),
                    _ => Request::MetaSet { meta, data },
                }
            }
            Spec::MetaNoop => Request::MetaNoop,
            Spec::MetaDebug { key, base64 } => Request::MetaDebug {
                key: MetaKey {
                    raw: key,
                    base64: *base64,
                },
            },
        }
    }
}

/// Keys are leaked into one span so that `Keys` can borrow it; fine for a test process.
fn keys_span(keys: &[Vec<u8>]) -> &'static [u8] {
    Box::leak(keys.join(&b' ').into_boxed_slice())
}

/// Key bytes: anything but NUL, '\n' and space (memcached's rule; control bytes included).
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[a-zA-Z0-9_:.-]{1,12}".prop_map(String::into_bytes),
        vec(0x21u8..=0xff, 1..40),
        vec(
            (1u8..=0xff).prop_filter("separator", |b| *b != b'\n' && *b != b' '),
            1..40
        ),
        Just(b"noreply".to_vec()),
        Just(vec![b'k'; 250]),
    ]
}

fn exptime() -> impl Strategy<Value = i64> {
    prop_oneof![-10i64..100_000, any::<i64>()]
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..64),
        Just(b"\r\n".to_vec()),
        Just(b"x\r\ny".to_vec())
    ]
}

fn store_mode() -> impl Strategy<Value = StoreMode> {
    prop_oneof![
        Just(StoreMode::Set),
        Just(StoreMode::Add),
        Just(StoreMode::Replace),
        Just(StoreMode::Append),
        Just(StoreMode::Prepend),
        any::<u64>().prop_map(StoreMode::Cas),
    ]
}

/// Flag tokens valid for meta command `cmd`, in random order, each at most once.
fn meta_flags(cmd: u8, base64: bool) -> impl Strategy<Value = Vec<u8>> {
    let mode = match cmd {
        b's' => prop_oneof![Just("ME"), Just("MA"), Just("MP"), Just("MR"), Just("MS")].boxed(),
        b'a' => prop_oneof![Just("MI"), Just("M+"), Just("MD"), Just("M-")].boxed(),
        _ => prop_oneof![Just("MS"), Just("Mx")].boxed(),
    };
    let simple: Vec<&'static str> = [
        "c", "f", "h", "k", "l", "q", "s", "t", "u", "v", "I", "P", "L",
    ]
    .to_vec();
    (
        subsequence(simple, 0..=8),
        proptest::option::of(exptime()),
        proptest::option::of(exptime()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of("[a-zA-Z0-9]{0,31}"),
        proptest::option::of(mode),
        proptest::option::of(any::<u64>()),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(simple, t, n, f, c, d, o, m, e, shuffle)| {
            // `b` goes first so that the truncation to 17 flags below keeps it.
            let mut toks: Vec<String> = if base64 {
                vec!["b".to_string()]
            } else {
                Vec::new()
            };
            toks.extend(simple.iter().map(|s| s.to_string()));
            toks.extend(t.map(|t| format!("T{t}")));
            toks.extend(n.map(|n| format!("N{n}")));
            toks.extend(f.map(|f| format!("F{f}")));
            toks.extend(c.map(|c| format!("C{c}")));
            toks.extend(d.map(|d| format!("D{d}")));
            toks.extend(o.map(|o| format!("O{o}")));
            toks.extend(m.map(str::to_string));
            if cmd == b's' {
                toks.extend(e.map(|e| format!("E{e}")));
            }
            toks.truncate(17);
            let len = toks.len();
            if len > 1 {
                toks.swap(0, shuffle.index(len));
            }
            toks.join(" ").into_bytes()
        })
}

fn meta_key(base64: bool) -> BoxedStrategy<Vec<u8>> {
    if base64 {
        vec(any::<u8>(), 1..60)
            .prop_map(|raw| {
                let mut enc = Vec::new();
                super::base64::encode_into(&mut enc, &raw);
                enc
            })
            .boxed()
    } else {
        key().boxed()
    }
}

fn meta_spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![Just(b'g'), Just(b's'), Just(b'd'), Just(b'a')],
        any::<bool>(),
    )
        .prop_flat_map(|(cmd, base64)| {
            (meta_key(base64), meta_flags(cmd, base64), data()).prop_map(
                move |(key, flags, data)| Spec::Meta {
                    cmd,
                    key,
                    base64,
                    flags,
                    data: if cmd == b's' { data } else { Vec::new() },
                },
            )
        })
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (vec(key(), 1..6), any::<bool>()).prop_map(|(keys, cas)| Spec::Get { keys, cas }),
        (exptime(), vec(key(), 0..4), any::<bool>()).prop_map(|(exptime, keys, cas)| Spec::Gat {
            exptime,
            keys,
            cas
        }),
        (
            store_mode(),
            key(),
            any::<u32>(),
            exptime(),
            data(),
            any::<bool>()
        )
            .prop_map(|(mode, key, flags, exptime, data, noreply)| Spec::Store {
                mode,
                key,
                flags,
                exptime,
                data,
                noreply
            }),
        (key(), any::<bool>()).prop_map(|(key, noreply)| Spec::Delete { key, noreply }),
        (key(), any::<u64>(), any::<bool>(), any::<bool>()).prop_map(
            |(key, delta, incr, noreply)| Spec::Arith {
                key,
                delta,
                incr,
                noreply
            }
        ),
        (key(), exptime(), any::<bool>()).prop_map(|(key, exptime, noreply)| Spec::Touch {
            key,
            exptime,
            noreply
        }),
        (proptest::option::of(exptime()), any::<bool>())
            .prop_map(|(delay, noreply)| Spec::FlushAll { delay, noreply }),
        proptest::option::of("[a-z]{1,10}".prop_map(String::into_bytes))
            .prop_map(|arg| Spec::Stats { arg }),
        Just(Spec::Version),
        (any::<u32>(), any::<bool>())
            .prop_map(|(level, noreply)| Spec::Verbosity { level, noreply }),
        Just(Spec::Quit),
        meta_spec(),
        Just(Spec::MetaNoop),
        any::<bool>().prop_flat_map(
            |base64| meta_key(base64).prop_map(move |key| Spec::MetaDebug { key, base64 })
        ),
    ]
}

/// Fragments that make protocol-like noise.
const PIECES: &[&[u8]] = &[
    b"get ",
    b"set k 0 0 ",
    b"ms k ",
    b"mg k ",
    b"cas ",
    b"incr ",
    b"delete ",
    b"gat ",
    b"flush_all ",
    b"me ",
    b"mn",
    b"\r\n",
    b"\n",
    b" ",
    b"noreply",
    b"1",
    b"0",
    b"-1",
    b"3",
    b"v",
    b"q",
    b"T",
    b"O",
    b"b",
    b"YQ==",
    b"x",
    b"abc",
    b"HTTP/1.1",
    b"\r",
];

fn compose(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    compose_request(req, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn compose_then_parse_is_identity(spec in spec()) {
        let req = spec.build();
        let wire = compose(&req);
        prop_assert_eq!(parse_request(&wire, &Limits::default()), Ok((req, wire.len())));
    }

    #[test]
    fn every_strict_prefix_is_incomplete(spec in spec()) {
        let req = spec.build();
        let wire = compose(&req);
        for k in 0..wire.len() {
            prop_assert_eq!(parse_request(&wire[..k], &Limits::default()), Err(ParseError::Incomplete), "prefix {} of {:?}", k, String::from_utf8_lossy(&wire));
        }
    }

    #[test]
    fn pipelined_requests_parse_in_order(specs in vec(spec(), 1..8), cut in any::<prop::sample::Index>()) {
        let reqs: Vec<Request<'_>> = specs.iter().map(Spec::build).collect();
        let mut wire = Vec::new();
        for r in &reqs {
            compose_request(r, &mut wire);
        }
        let limits = Limits::default();
        // Reading the stream in two pieces at an arbitrary point, as a connection would.
        let cut = cut.index(wire.len() + 1);
        let mut buf = wire[..cut].to_vec();
        let mut fed = cut;
        let mut got = Vec::new();
        let mut start = 0;
        loop {
            match parse_request(&buf[start..], &limits) {
                Ok((r, n)) => {
                    got.push(compose(&r));
                    start += n;
                }
                Err(ParseError::Incomplete) if fed < wire.len() => {
                    buf.extend_from_slice(&wire[fed..]);
                    fed = wire.len();
                }
                Err(ParseError::Incomplete) => break,
                Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
            }
        }
        prop_assert_eq!(start, wire.len());
        let want: Vec<Vec<u8>> = reqs.iter().map(compose).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn invariants_hold_on_noise(data in vec(any::<u8>(), 0..200)) {
        check_stream(&data, &Limits { max_line_len: 128, max_value_len: 64, ..Limits::default() });
    }

    #[test]
    fn invariants_hold_on_protocol_like_noise(parts in vec(proptest::sample::select(PIECES), 0..30)) {
        let data = parts.concat();
        check_stream(&data, &Limits { max_line_len: 64, max_value_len: 8, ..Limits::default() });
        check_parse(&data, &Limits::default());
    }
}
