//! Small helpers every layer uses: name suggestions, panic payloads, poison-tolerant locks and
//! compact strides.
//!
//! This module is the bottom of the layering (`docs/architecture.md`): it imports nothing of
//! kiln, so any module may use it.

use std::sync::{Mutex, MutexGuard};

/// `seconds` in milliseconds, with four decimals, or with four significant digits below 1 ms
/// (at most nine decimals): a kernel of 0.11 us reads `0.0001103`, not `0.0001`, so that the
/// times a tuner compares can be told apart.
pub fn ms(seconds: f64) -> String {
    let v = seconds * 1e3;
    let decimals = if v > 0.0 && v < 1.0 && v.is_finite() {
        (3 - v.log10().floor() as i32).clamp(4, 9) as usize
    } else {
        4
    };
    format!("{v:.decimals$}")
}

/// Edit distance between `a` and `b` in chars, counting a swap of neighbours as one edit
/// (optimal string alignment): `edit_distance("fosat", "float") == 2`.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for (j, cell) in d.iter_mut().enumerate().take(w) {
        *cell = j;
    }
    for i in 1..=a.len() {
        d[i * w] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j - 1] + cost)
                .min(d[(i - 1) * w + j] + 1)
                .min(d[i * w + j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
        }
    }
    d[a.len() * w + b.len()]
}

/// The message of a caught panic payload (`&str` or `String`; anything else is named as such).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Locks `m`, taking the guard of a poisoned mutex too.
///
/// kiln's tables are updated in one step under their lock (an insert, a push, a counter), so a
/// panic on another thread never leaves them half-written: the data behind a poisoned lock is
/// still consistent, and refusing it would turn one caught panic into failures of every later
/// call.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Compact row-major strides, in elements, of `shape`: the last dimension has stride 1, and
/// each other the product of the extents after it. An extent of 0 (or less) counts as 1, as in
/// DLPack and numpy, so the strides stay meaningful (and the same) for empty tensors; products
/// saturate instead of overflowing.
pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ms_keeps_four_significant_digits_below_a_millisecond() {
        assert_eq!(ms(1.1037e-7), "0.0001104");
        assert_eq!(ms(2.5e-3), "2.5000");
        assert_eq!(ms(0.25e-3), "0.2500");
        assert_eq!(ms(0.0), "0.0000");
        assert_eq!(ms(1e-15), "0.000000000");
        assert_eq!(ms(f64::INFINITY), "inf");
    }

    #[test]
    fn edit_distance_counts_a_swap_as_one_edit() {
        assert_eq!(edit_distance("float", "float"), 0);
        assert_eq!(edit_distance("flaot", "float"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn compact_strides_are_row_major_and_treat_empty_extents_as_one() {
        assert_eq!(compact_strides(&[2, 3, 4]), [12, 4, 1]);
        assert_eq!(compact_strides(&[2, 0, 4]), [4, 4, 1]);
        assert_eq!(compact_strides(&[]), Vec::<i64>::new());
        assert_eq!(compact_strides(&[2, i64::MAX, 4])[0], i64::MAX);
    }

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
