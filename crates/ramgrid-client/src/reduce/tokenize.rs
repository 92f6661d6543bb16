//! The reference experiment's tokeniser (python/ramgrid/lm/corpus.py): Python's `str.split()`
//! with no argument, then tokens longer than [`MAX_TOKEN_CHARS`] characters (code points, not
//! bytes) dropped.
//!
//! `str.split()` splits on runs of the characters for which `str.isspace()` is true, which is
//! not Rust's `char::is_whitespace`: it adds the ASCII separators U+001C..U+001F. The set, as
//! CPython 3.11 has it: U+0009..U+000D, U+001C..U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A,
//! U+2028, U+2029, U+202F, U+205F, U+3000.

/// Tokens longer than this many characters are dropped, as the reference experiment did.
pub const MAX_TOKEN_CHARS: usize = 100;

/// Byte classes: 0 a byte inside a token (ASCII non-space, continuation bytes, lead bytes no
/// space starts with), 1 an ASCII space, 2 the lead byte of a multi-byte character that may be a
/// space (U+0085 and U+00A0 start with 0xC2, U+1680 with 0xE1, U+2000..U+205F with 0xE2, U+3000
/// with 0xE3).
const fn classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut c = 0x09;
    while c <= 0x0d {
        t[c] = 1;
        c += 1;
    }
    let mut c = 0x1c;
    while c <= 0x20 {
        t[c] = 1;
        c += 1;
    }
    t[0xc2] = 2;
    t[0xe1] = 2;
    t[0xe2] = 2;
    t[0xe3] = 2;
    t
}

static CLASS: [u8; 256] = classes();

/// Byte length of the whitespace character starting at `b[i]`, or 0 when it is not one. `b` is
/// valid UTF-8 and `i` a character boundary. Out of line: the loops only call it for the four
/// lead bytes of class 2, so the common ASCII path stays small.
#[inline(never)]
fn space_at(b: &[u8], i: usize) -> usize {
    let c = b[i];
    match CLASS[c as usize] {
        0 => return 0,
        1 => return 1,
        _ => {}
    }
    let at = |k: usize| b.get(i + k).copied().unwrap_or(0);
    let hit = match c {
        0xc2 => matches!(at(1), 0x85 | 0xa0),   // U+0085, U+00A0
        0xe1 => at(1) == 0x9a && at(2) == 0x80, // U+1680
        0xe2 => match at(1) {
            0x80 => matches!(at(2), 0x80..=0x8a | 0xa8 | 0xa9 | 0xaf), // U+2000..200A, 2028, 2029, 202F
            0x81 => at(2) == 0x9f,                                     // U+205F
            _ => false,
        },
        0xe3 => at(1) == 0x80 && at(2) == 0x80, // U+3000
        _ => false,
    };
    if !hit {
        0
    } else if c == 0xc2 {
        2
    } else {
        3
    }
}

/// True when `tok` has more than [`MAX_TOKEN_CHARS`] code points.
#[inline]
fn too_long(tok: &str) -> bool {
    // A character is at least one byte, so only long byte strings need counting.
    tok.len() > MAX_TOKEN_CHARS
        && tok.bytes().filter(|&b| (b & 0xc0) != 0x80).count() > MAX_TOKEN_CHARS
}

/// Calls `each` with every token of `line` in order; returns how many tokens were dropped for
/// being too long.
#[inline]
pub fn tokenize<'a>(line: &'a str, mut each: impl FnMut(&'a str)) -> usize {
    let b = line.as_bytes();
    let n = b.len();
    let mut dropped = 0;
    let mut i = 0;
    loop {
        // Skip a run of whitespace.
        while i < n {
            match CLASS[b[i] as usize] {
                0 => break,
                1 => i += 1,
                _ => match space_at(b, i) {
                    0 => break,
                    w => i += w,
                },
            }
        }
        if i >= n {
            return dropped;
        }
        let start = i;
        // One table look-up per byte; continuation bytes are class 0, so a multi-byte character
        // is stepped over byte by byte and a token only ends where a space starts.
        while i < n {
            match CLASS[b[i] as usize] {
                0 => i += 1,
                1 => break,
                _ if space_at(b, i) != 0 => break,
                _ => i += 1,
            }
        }
        // Both ends are character boundaries: `start` follows whitespace or the start, `i` is
        // whitespace or the end.
        let tok = &line[start..i];
        if too_long(tok) {
            dropped += 1;
        } else {
            each(tok);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<&str> {
        let mut v = Vec::new();
        tokenize(s, |t| v.push(t));
        v
    }

    #[test]
    fn splits_like_python_str_split() {
        assert_eq!(toks(""), Vec::<&str>::new());
        assert_eq!(toks("   \t\n "), Vec::<&str>::new());
        assert_eq!(toks("a"), ["a"]);
        assert_eq!(
            toks("  the cat\tsat\n\non  the\x0bmat\x0c. "),
            ["the", "cat", "sat", "on", "the", "mat", "."]
        );
        assert_eq!(toks("a\rb"), ["a", "b"]);
    }

    #[test]
    fn python_whitespace_is_not_rust_whitespace() {
        // U+001C..U+001F split in Python (str.isspace) though Rust's is_whitespace says no.
        for sep in ['\x1c', '\x1d', '\x1e', '\x1f'] {
            assert!(!sep.is_whitespace());
            assert_eq!(toks(&format!("a{sep}b")), ["a", "b"], "{:?}", sep);
        }
        for sep in [
            '\u{85}', '\u{a0}', '\u{1680}', '\u{2000}', '\u{2005}', '\u{200a}', '\u{2028}',
            '\u{2029}', '\u{202f}', '\u{205f}', '\u{3000}',
        ] {
            assert_eq!(
                toks(&format!("x{sep}y{sep}{sep}z")),
                ["x", "y", "z"],
                "{:?}",
                sep
            );
        }
        // Not whitespace in Python: zero-width space, Mongolian vowel separator, BOM, U+200B..
        for keep in ['\u{200b}', '\u{180e}', '\u{feff}', '\u{2060}', '\u{200c}'] {
            let s = format!("x{keep}y");
            assert_eq!(toks(&s), [s.as_str()], "{:?}", keep);
        }
        // Neighbours of the multi-byte spaces share their lead bytes and are not spaces.
        for keep in [
            '\u{80}', '\u{a1}', '\u{1681}', '\u{200b}', '\u{2027}', '\u{2030}', '\u{205e}',
            '\u{3001}', '\u{00e9}',
        ] {
            let s = format!("x{keep}y");
            assert_eq!(toks(&s), [s.as_str()], "{:?}", keep);
        }
    }

    #[test]
    fn drops_tokens_over_100_characters_not_bytes() {
        let a100 = "a".repeat(100);
        let a101 = "a".repeat(101);
        assert_eq!(toks(&format!("x {a100} y")), ["x", a100.as_str(), "y"]);
        let mut dropped_seen = 0;
        let mut v = Vec::new();
        dropped_seen += tokenize(&format!("x {a101} y {a101}"), |t| v.push(t.to_string()));
        assert_eq!(v, ["x", "y"]);
        assert_eq!(dropped_seen, 2);
        // 100 two-byte characters (200 bytes) are 100 characters: kept. 101 are dropped.
        let e100 = "é".repeat(100);
        let e101 = "é".repeat(101);
        assert_eq!(toks(&e100), [e100.as_str()]);
        assert_eq!(toks(&e101), Vec::<&str>::new());
        // 4-byte characters (emoji) likewise.
        let f100 = "\u{1f600}".repeat(100);
        assert_eq!(toks(&f100), [f100.as_str()]);
        assert_eq!(toks(&"\u{1f600}".repeat(101)), Vec::<&str>::new());
    }

    #[test]
    fn replacement_characters_count_once() {
        // Invalid UTF-8 is replaced (as Python's "replace" does) before tokenising: each U+FFFD
        // is one character of three bytes.
        let line = String::from_utf8_lossy(b"ab\xff\xfe c\xed\xa0\x80d");
        assert_eq!(
            toks(&line),
            ["ab\u{fffd}\u{fffd}", "c\u{fffd}\u{fffd}\u{fffd}d"]
        );
    }
}
