//! Chunked batches against real `ramgrid-server` processes: a read stays on the version its first
//! chunk resolved even when the current version changes between chunks, a write's failed keys are
//! reported by their index in the whole batch after every chunk was tried, and the hook between
//! chunks can stop a batch.

mod common;

use common::Cluster;

use ramgrid_client::{ChunkedError, Error, Keys, ValueType, Values, ValuesRef};

fn i64s(v: &Values) -> &[i64] {
    match v {
        Values::I64(v) => v,
        other => panic!("expected i64 values, got {other:?}"),
    }
}

#[test]
fn a_chunked_read_keeps_the_version_of_its_first_chunk() {
    let cluster = Cluster::start(2);
    let c = cluster.client();
    c.create_table("t", 8, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..100).collect();
    c.put("t", Keys::I64(&keys), ValuesRef::I64(&keys), 0)
        .unwrap();
    c.seal_version("t", 1).unwrap();

    // Between the first and second chunk, version 2 (every value negated) becomes current.
    let mut switched = false;
    let got = c
        .get_chunked("t", 0, Keys::I64(&keys), 0, 30, || {
            if !switched {
                switched = true;
                let v = c.create_version("t")?;
                let neg: Vec<i64> = keys.iter().map(|k| -k).collect();
                c.put("t", Keys::I64(&keys), ValuesRef::I64(&neg), v)?;
                c.seal_version("t", v)?;
                c.set_current("t", v)?;
            }
            Ok::<(), Error>(())
        })
        .unwrap();
    assert!(switched);
    assert_eq!(got.version, 1);
    assert!(got.found.iter().all(|&f| f));
    assert_eq!(i64s(&got.values), keys.as_slice());

    // A new read, unpinned, sees version 2 throughout.
    let got = c
        .get_chunked("t", 0, Keys::I64(&keys), 0, 30, || Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(got.version, 2);
    assert_eq!(i64s(&got.values)[99], -99);
}

#[test]
fn a_chunked_write_reports_every_chunks_failed_keys_by_batch_index() {
    let cluster = Cluster::start(1);
    let c = cluster.client();
    c.create_table("b", 4, 1, ValueType::Bytes).unwrap();
    // Keys over the wire format's 65535 bytes fail alone, unsent; they fall in chunks 0 and 2.
    let long = vec![b'x'; 70_000];
    let names: Vec<Vec<u8>> = (0..12)
        .map(|i| match i {
            2 | 9 => long.clone(),
            _ => format!("k{i}").into_bytes(),
        })
        .collect();
    let keys: Vec<&[u8]> = names.iter().map(|k| k.as_slice()).collect();
    let values: Vec<&[u8]> = vec![b"v"; 12];
    let mut chunks_after_first = 0;
    let err = c
        .put_chunked(
            "b",
            Keys::Slices(&keys),
            ValuesRef::Slices(&values),
            0,
            4,
            || {
                chunks_after_first += 1;
                Ok::<(), ()>(())
            },
        )
        .unwrap_err();
    assert_eq!(chunks_after_first, 2);
    match err {
        ChunkedError::Failed(Error::Batch { failures }) => {
            assert_eq!(failures.iter().map(|f| f.0).collect::<Vec<_>>(), [2, 9]);
        }
        other => panic!("expected a batch error, got {other:?}"),
    }
    // The other keys were stored, the last chunk's included.
    let stored: Vec<&[u8]> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2 && *i != 9)
        .map(|(_, k)| *k)
        .collect();
    let got = c.get("b", Keys::Slices(&stored), 0).unwrap();
    assert!(got.found.iter().all(|&f| f));

    let deleted = c
        .delete_chunked("b", Keys::Slices(&stored), 0, 3, || Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(deleted, stored.len());
}

#[test]
fn the_hook_between_chunks_stops_a_write_after_the_chunks_before_it() {
    let cluster = Cluster::start(1);
    let c = cluster.client();
    c.create_table("s", 4, 1, ValueType::I64).unwrap();
    let keys: Vec<i64> = (0..10).collect();
    let err = c
        .put_chunked("s", Keys::I64(&keys), ValuesRef::I64(&keys), 0, 4, || {
            Err("interrupted")
        })
        .unwrap_err();
    assert!(matches!(err, ChunkedError::Stopped("interrupted")));
    let got = c.get("s", Keys::I64(&keys), 0).unwrap();
    assert_eq!(got.found, [[true; 4].as_slice(), &[false; 6]].concat());
}

#[test]
fn a_chunked_f64_lookup_keeps_the_version_of_its_first_chunk() {
    let cluster = Cluster::start(1);
    let c = cluster.client();
    c.create_table("f", 4, 1, ValueType::F64).unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
    let keys: Vec<&[u8]> = names.iter().map(|k| k.as_bytes()).collect();
    let ones = vec![1.0; 50];
    c.put("f", Keys::Slices(&keys), ValuesRef::F64(&ones), 0)
        .unwrap();
    c.seal_version("f", 1).unwrap();
    let mut values = vec![0.0; 50];
    let mut found = vec![false; 50];
    let mut switched = false;
    let version = c
        .lookup_f64_chunked("f", 0, 0, &keys, &mut values, &mut found, 20, || {
            if !switched {
                switched = true;
                let v = c.create_version("f")?;
                c.put("f", Keys::Slices(&keys), ValuesRef::F64(&[2.0; 50]), v)?;
                c.seal_version("f", v)?;
                c.set_current("f", v)?;
            }
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(version, 1);
    assert!(found.iter().all(|&f| f));
    assert_eq!(values, ones);
}
