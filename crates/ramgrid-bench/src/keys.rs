//! The benchmark key space: key ids 0..count written as fixed-width keys like `key:0000000123`.
//!
//! Every key has the same length, so the key size is a true parameter of the run, and a key read back
//! from a reply can be turned into its id without a lookup table.

use anyhow::{bail, Result};

const PREFIX: &[u8] = b"key:";
/// memcached's limit on key length.
const MAX_KEY: usize = 250;

/// Fixed-width decimal keys with a common prefix.
#[derive(Debug, Clone, Copy)]
pub struct KeySpace {
    count: u64,
    size: usize,
}

impl KeySpace {
    /// A key space of `count` keys, each exactly `size` bytes long.
    pub fn new(count: u64, size: usize) -> Result<KeySpace> {
        if count == 0 {
            bail!("--key-count must be at least 1");
        }
        let digits = (count - 1).checked_ilog10().map_or(1, |d| d as usize + 1);
        let min = PREFIX.len() + digits;
        if size < min || size > MAX_KEY {
            bail!(
                "--key-size must be between {min} and {MAX_KEY} bytes for {count} keys, got {size}"
            );
        }
        Ok(KeySpace { count, size })
    }

    /// Number of keys.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Appends the key with this id to `out`.
    pub fn write(&self, id: u64, out: &mut Vec<u8>) {
        debug_assert!(id < self.count);
        out.extend_from_slice(PREFIX);
        let width = self.size - PREFIX.len();
        let start = out.len();
        out.resize(start + width, b'0');
        let mut rest = id;
        for slot in out[start..].iter_mut().rev() {
            if rest == 0 {
                break;
            }
            *slot = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
    }

    /// The id of a key of this space, or `None` when the bytes are not one.
    pub fn id_of(&self, key: &[u8]) -> Option<u64> {
        if key.len() != self.size {
            return None;
        }
        let digits = key.strip_prefix(PREFIX)?;
        let mut id = 0u64;
        for &b in digits {
            if !b.is_ascii_digit() {
                return None;
            }
            id = id.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        }
        (id < self.count).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width_and_round_trip() {
        let space = KeySpace::new(1_000_000, 14).unwrap();
        for id in [0, 7, 123, 999_999] {
            let mut key = Vec::new();
            space.write(id, &mut key);
            assert_eq!(key.len(), 14);
            assert_eq!(space.id_of(&key), Some(id));
        }
        let mut key = Vec::new();
        space.write(123, &mut key);
        assert_eq!(key, b"key:0000000123");
    }

    #[test]
    fn foreign_keys_have_no_id() {
        let space = KeySpace::new(100, 8).unwrap();
        for key in [
            &b"key:00010"[..],
            b"key:001",
            b"kez:0001",
            b"key:00x1",
            b"key:0100",
        ] {
            assert_eq!(space.id_of(key), None, "{:?}", String::from_utf8_lossy(key));
        }
        assert_eq!(space.id_of(b"key:0099"), Some(99));
    }

    #[test]
    fn sizes_that_cannot_hold_every_id_are_refused() {
        assert!(KeySpace::new(1_000_000, 9).is_err());
        assert!(KeySpace::new(1_000_000, 10).is_ok());
        assert!(KeySpace::new(1, 5).is_ok());
        assert!(KeySpace::new(10, 251).is_err());
        assert!(KeySpace::new(0, 14).is_err());
    }
}
