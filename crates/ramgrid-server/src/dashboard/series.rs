//! Per-second samples of one member's activity, kept in a ring for the dashboard's charts: each
//! sample is the difference between two scrapes of its counters, divided by the time between them.

use std::collections::VecDeque;

use super::scrape::{Figures, BUCKETS};
use crate::metrics::LATENCY_BUCKETS;

/// Samples kept per member: five minutes at one a second.
pub const KEEP: usize = 300;

/// One member's activity over one interval (about a second), as rates per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Unix time of the interval's end, in whole seconds.
    pub t: u64,
    /// Keys asked by data requests per second.
    pub ops: f64,
    /// Keys found per second.
    pub hits: f64,
    /// Keys not found per second.
    pub misses: f64,
    /// Frames refused whole per second.
    pub refused: f64,
    /// Native frames that ended in each latency bucket during the interval (not a rate: the
    /// percentiles of several members come from the sum of their counts).
    pub buckets: [u64; BUCKETS],
}

impl Sample {
    /// The sample between scrapes `a` and `b`, `secs` apart, ending at unix second `t`. A counter
    /// that went down (the member restarted) counts from zero.
    pub fn between(a: &Figures, b: &Figures, secs: f64, t: u64) -> Sample {
        let d = |x: u64, y: u64| if y >= x { y - x } else { y };
        let rate = |x, y| d(x, y) as f64 / secs.max(1e-3);
        let refused_a: u64 = a.refused.values().sum();
        let refused_b: u64 = b.refused.values().sum();
        let mut buckets = [0; BUCKETS];
        for (i, c) in buckets.iter_mut().enumerate() {
            *c = d(a.buckets[i], b.buckets[i]);
        }
        Sample {
            t,
            ops: rate(a.keys, b.keys),
            hits: rate(a.hits, b.hits),
            misses: rate(a.misses, b.misses),
            refused: rate(refused_a, refused_b),
            buckets,
        }
    }
}

/// The last [`KEEP`] samples of one member, oldest first.
#[derive(Debug, Default)]
pub struct Ring(VecDeque<Sample>);

impl Ring {
    /// Adds a sample; one for a second already sampled replaces it.
    pub fn push(&mut self, s: Sample) {
        if self.0.back().is_some_and(|l| l.t >= s.t) {
            self.0.pop_back();
        }
        if self.0.len() == KEEP {
            self.0.pop_front();
        }
        self.0.push_back(s);
    }

    /// The samples, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        self.0.iter()
    }

    /// The newest sample.
    pub fn last(&self) -> Option<&Sample> {
        self.0.back()
    }
}

/// The `q` quantile (0 < q < 1) of counts per latency bucket, in milliseconds, interpolated
/// linearly inside its bucket; `None` without counts. The `+Inf` bucket reports the largest bound.
pub fn quantile_ms(buckets: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, &c) in buckets.iter().enumerate() {
        if c > 0 && (below + c) as f64 >= rank {
            let Some(&hi) = LATENCY_BUCKETS.get(i) else {
                return Some(LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1] * 1e3);
            };
            let lo = if i == 0 { 0.0 } else { LATENCY_BUCKETS[i - 1] };
            let within = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
            return Some((lo + (hi - lo) * within) * 1e3);
        }
        below += c;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_the_rate_between_two_scrapes() {
        let a = Figures {
            keys: 100,
            hits: 50,
            misses: 10,
            ..Figures::default()
        };
        let mut b = Figures {
            keys: 300,
            hits: 150,
            misses: 10,
            ..Figures::default()
        };
        b.refused.insert("NOT_OWNER".into(), 4);
        b.buckets[2] = 7;
        let s = Sample::between(&a, &b, 2.0, 99);
        assert_eq!(
            (s.t, s.ops, s.hits, s.misses, s.refused),
            (99, 100.0, 50.0, 0.0, 2.0)
        );
        assert_eq!(s.buckets[2], 7);
        // A restarted member's counters start again from zero.
        let s = Sample::between(&b, &a, 1.0, 100);
        assert_eq!(s.ops, 100.0);
    }

    #[test]
    fn the_ring_keeps_the_last_samples_one_per_second() {
        let mut r = Ring::default();
        let s = |t| Sample {
            t,
            ops: t as f64,
            hits: 0.0,
            misses: 0.0,
            refused: 0.0,
            buckets: [0; BUCKETS],
        };
        for t in 0..(KEEP as u64 + 10) {
            r.push(s(t));
        }
        r.push(s(KEEP as u64 + 9));
        assert_eq!(r.iter().count(), KEEP);
        assert_eq!(r.iter().next().map(|s| s.t), Some(10));
        assert_eq!(r.last().map(|s| s.t), Some(KEEP as u64 + 9));
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket() {
        let mut b = [0u64; BUCKETS];
        assert_eq!(quantile_ms(&b, 0.5), None);
        b[0] = 50; // (0, 50 us]
        b[1] = 50; // (50, 100 us]
        let p50 = quantile_ms(&b, 0.5).unwrap();
        assert!((p50 - 0.05).abs() < 1e-9, "{p50}");
        let p99 = quantile_ms(&b, 0.99).unwrap();
        assert!(p99 > 0.09 && p99 <= 0.1, "{p99}");
        b[BUCKETS - 1] = 1000;
        assert_eq!(quantile_ms(&b, 0.99), Some(2500.0));
    }
}
