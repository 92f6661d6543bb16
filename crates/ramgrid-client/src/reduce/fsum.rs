//! Correctly rounded summation, bit for bit the algorithm of CPython's `math.fsum` (Shewchuk's
//! exact partials, then the half-even fix-up across partials), so that a sum computed here equals
//! the one the Python reference computes, whatever the order of the values.

/// Why a sum has no value. `math.fsum` raises for the same two cases (OverflowError and
/// ValueError respectively).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsumError {
    /// Finite values whose partial sum overflows (e.g. `[1e308, 1e308, -1e308]`).
    IntermediateOverflow,
    /// Both `inf` and `-inf` among the values.
    InfMinusInf,
}

impl std::fmt::Display for FsumError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FsumError::IntermediateOverflow => "intermediate overflow in fsum",
            FsumError::InfMinusInf => "-inf + inf in fsum",
        })
    }
}

/// An exact running sum: `add` values, then `value` rounds once. Reusable (`clear`) so a caller
/// summing many short records keeps one allocation for the partials.
#[derive(Debug, Default)]
pub struct Fsum {
    /// Non-overlapping partials in increasing magnitude; their exact sum is the sum so far.
    partials: Vec<f64>,
    special: f64,
    inf: f64,
    overflow: bool,
}

impl Fsum {
    /// An empty sum (its value is 0.0, as `math.fsum([])`).
    pub fn new() -> Fsum {
        Fsum::default()
    }

    /// Forgets every value added.
    pub fn clear(&mut self) {
        self.partials.clear();
        self.special = 0.0;
        self.inf = 0.0;
        self.overflow = false;
    }

    /// Adds `x` exactly.
    #[inline]
    pub fn add(&mut self, x_in: f64) {
        let mut x = x_in;
        let p = &mut self.partials;
        let mut i = 0;
        for j in 0..p.len() {
            let mut y = p[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                p[i] = lo;
                i += 1;
            }
            x = hi;
        }
        p.truncate(i);
        if x != 0.0 {
            if !x.is_finite() {
                // A non-finite x comes from an inf or nan among the values, or from overflow of
                // finite ones; CPython tells them apart by the value added.
                if x_in.is_finite() {
                    self.overflow = true;
                }
                if x_in.is_infinite() {
                    self.inf += x_in;
                }
                self.special += x_in;
                p.clear();
            } else {
                p.push(x);
            }
        }
    }

    /// The correctly rounded sum of the values added so far.
    pub fn value(&self) -> Result<f64, FsumError> {
        // CPython raises at the add that overflowed, before any later inf or nan is seen.
        if self.overflow {
            return Err(FsumError::IntermediateOverflow);
        }
        if self.special != 0.0 {
            if self.inf.is_nan() {
                return Err(FsumError::InfMinusInf);
            }
            return Ok(self.special);
        }
        let p = &self.partials;
        let mut n = p.len();
        if n == 0 {
            return Ok(0.0);
        }
        n -= 1;
        let mut hi = p[n];
        let mut lo = 0.0;
        // Sum from the top down, stopping when the sum becomes inexact.
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = p[n];
            hi = x + y;
            lo = y - (hi - x);
            if lo != 0.0 {
                break;
            }
        }
        // Half-even rounding across partials: if the rest has the sign of `lo`, the true sum is
        // past the halfway point that `hi + lo` rounded at.
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            if y == x - hi {
                hi = x;
            }
        }
        Ok(hi)
    }
}

/// `math.fsum(values)`.
pub fn fsum(values: impl IntoIterator<Item = f64>) -> Result<f64, FsumError> {
    let mut s = Fsum::new();
    values.into_iter().for_each(|v| s.add(v));
    s.value()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> f64 {
        // Python's float.hex format, e.g. "0x1.0000000000001p+0".
        let neg = s.starts_with('-');
        let s = s.trim_start_matches('-').trim_start_matches("0x");
        let (mant, exp) = s.split_once('p').unwrap();
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        let frac_bits = u64::from_str_radix(&format!("{frac:0<13}"), 16).unwrap();
        let e: i32 = exp.parse().unwrap();
        assert_eq!(int, "1");
        let bits = (((e + 1023) as u64) << 52) | frac_bits;
        let v = f64::from_bits(bits);
        if neg {
            -v
        } else {
            v
        }
    }

    /// Expected values computed with CPython 3.11's math.fsum (printed with float.hex).
    #[test]
    fn matches_cpython_on_adversarial_inputs() {
        assert_eq!(fsum([1e100, 1.0, -1e100]), Ok(1.0));
        assert_eq!(fsum([0.1; 10]), Ok(1.0));
        assert_eq!(fsum([1.0, 1e-16, 1e-16]), Ok(h("0x1.0000000000001p+0")));
        assert_eq!(fsum([1e16, 1.0, 1e-16]), Ok(h("0x1.1c37937e08001p+53")));
        // A plain sum of [0.1] * 10 is 0.9999999999999999; Kahan gets 1.0 there but not here:
        let naive: f64 = [1e16, 1.0, 1e-16].iter().sum();
        assert_ne!(naive.to_bits(), h("0x1.1c37937e08001p+53").to_bits());
    }

    #[test]
    fn half_even_across_partials() {
        // 2**53 + 1 + 2**-60: the exact sum is just above the halfway point, so it rounds up;
        // without the fix-up it would round to even (down).
        let two53 = 9007199254740992.0;
        assert_eq!(fsum([two53, 1.0, 2f64.powi(-60)]), Ok(two53 + 2.0));
        assert_eq!(fsum([two53, 1.0, -(2f64.powi(-60))]), Ok(two53));
        assert_eq!(fsum([two53, 1.0]), Ok(two53));
        assert_eq!(fsum([-two53, -1.0, -(2f64.powi(-60))]), Ok(-two53 - 2.0));
    }

    #[test]
    fn order_does_not_matter() {
        let v = [
            1e100, 3.0, -1e100, 1e-300, 7.5, -2.25, 1e16, -1e16, 0.1, 0.2, 0.3,
        ];
        let want = fsum(v).unwrap();
        let mut w = v;
        for k in 0..v.len() {
            w.rotate_left(1);
            assert_eq!(fsum(w).unwrap().to_bits(), want.to_bits(), "rotation {k}");
            w.reverse();
            assert_eq!(fsum(w).unwrap().to_bits(), want.to_bits(), "reversed {k}");
        }
        assert_eq!(want, 3.0 + 7.5 - 2.25 + 0.6000000000000001);
    }

    #[test]
    fn empty_zero_and_special_values() {
        assert_eq!(fsum([]), Ok(0.0));
        // fsum drops zeros, so -0.0 sums to +0.0 as in CPython 3.11.
        assert_eq!(fsum([-0.0]).unwrap().to_bits(), 0.0f64.to_bits());
        assert_eq!(fsum([f64::INFINITY, 1.0]), Ok(f64::INFINITY));
        // CPython raises at the add that overflows, even after an inf.
        assert_eq!(
            fsum([f64::NEG_INFINITY, -1e308, -1e308]),
            Err(FsumError::IntermediateOverflow)
        );
        assert_eq!(fsum([f64::NEG_INFINITY, -1e308]), Ok(f64::NEG_INFINITY));
        assert!(fsum([f64::NAN, 1.0]).unwrap().is_nan());
        assert!(fsum([f64::INFINITY, f64::NAN]).unwrap().is_nan());
        assert_eq!(
            fsum([f64::NEG_INFINITY, f64::INFINITY]),
            Err(FsumError::InfMinusInf)
        );
        assert_eq!(
            fsum([1e308, 1e308, -1e308]),
            Err(FsumError::IntermediateOverflow)
        );
        // Big values that never overflow on the way.
        assert_eq!(fsum([1e308, -1e308, 1e308]), Ok(1e308));
    }

    #[test]
    fn reuse_after_clear() {
        let mut s = Fsum::new();
        s.add(f64::INFINITY);
        s.add(1e100);
        s.clear();
        s.add(0.5);
        s.add(0.25);
        assert_eq!(s.value(), Ok(0.75));
    }
}
