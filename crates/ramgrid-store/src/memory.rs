//! Memory budgets: one type for every byte count the server holds against a limit (the tables'
//! data, the connection buffers), so each limit is stated, charged and reported the same way.
//!
//! Invariant: `used` is the sum of the charges taken and not yet released. [`Budget::try_charge`]
//! never lets it pass `limit`; [`Budget::force_charge`] may (for memory that is already allocated
//! and must be counted, such as the allocator rounding up a growth), and then every `try_charge`
//! fails until enough is released.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A byte budget shared by every holder of one kind of memory.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes, none used.
    pub fn new(limit: usize) -> Budget {
        Budget {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Takes `n` bytes if that keeps the total within the limit; otherwise takes nothing.
    pub fn try_charge(&self, n: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            });
        match taken {
            Ok(before) => {
                self.peak.fetch_max(before + n, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `n` bytes whatever the limit (memory already allocated that must be counted).
    pub fn force_charge(&self, n: usize) {
        let before = self.used.fetch_add(n, Ordering::AcqRel);
        self.peak.fetch_max(before + n, Ordering::Relaxed);
    }

    /// Gives back `n` bytes taken earlier.
    pub fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "released more than was charged");
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes that a `try_charge` could take now.
    pub fn available(&self) -> usize {
        self.limit.saturating_sub(self.used())
    }

    /// The most ever charged at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_passes_the_limit_by_try() {
        let b = Budget::new(100);
        assert!(b.try_charge(60));
        assert!(!b.try_charge(41));
        assert_eq!(b.used(), 60);
        assert!(b.try_charge(40));
        assert_eq!(b.available(), 0);
        b.release(50);
        assert_eq!(b.used(), 50);
        b.force_charge(70);
        assert_eq!(b.used(), 120);
        assert!(!b.try_charge(1));
        assert_eq!(b.available(), 0);
        assert_eq!(b.peak(), 120);
    }

    #[test]
    fn concurrent_charges_stay_within_the_limit() {
        let b = std::sync::Arc::new(Budget::new(1000));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if b.try_charge(7) {
                            assert!(b.used() <= 1000);
                            b.release(7);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.used(), 0);
        assert!(b.peak() <= 1000);
    }
}
