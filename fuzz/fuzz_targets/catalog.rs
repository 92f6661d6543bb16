//! Fuzzes the durable tables' catalog parser (crates/ramgrid-server/src/persist.rs,
//! `Catalog::parse`, what a restart runs on every `DIR/tables/*/catalog`): arbitrary text must
//! never panic, and a catalog that parses must write (`Catalog::to_text`) to a text that parses to
//! the same catalog, whose name line keeps to `[A-Za-z0-9_%-]` (a table name never reaches
//! outside its directory). The writer is canonical, the parser is not (`+5`, CRLF line ends and
//! lines after `sealed` are accepted), so catalogs are compared, not texts.
//!
//! Each input is parsed twice: as it is (files that are not UTF-8 are refused before the parser,
//! as the restart reads them with `read_to_string`), and resealed: everything before its last
//! `sum ` line (or all of it) followed by a `sum` line that matches, so that mutations reach the
//! field parsers instead of stopping at the checksum.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ramgrid_server::persist::Catalog;
use xxhash_rust::xxh3::xxh3_64;

fn check(text: &str) {
    if let Ok(c) = Catalog::parse(text) {
        let written = c.to_text();
        assert_eq!(
            Catalog::parse(&written).as_ref(),
            Ok(&c),
            "a written catalog parsed to another"
        );
        let name = written.lines().nth(1).unwrap();
        assert!(
            name.strip_prefix("name ")
                .is_some_and(|n| n
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'%')),
            "name line {name:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check(text);
    let body = &text[..text.rfind("sum ").unwrap_or(text.len())];
    check(&format!("{body}sum {:016x}\n", xxh3_64(body.as_bytes())));
});
