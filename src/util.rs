//! Small helpers every layer uses: name suggestions, panic payloads, poison-tolerant locks,
//! compact strides and bounded file reads.
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

/// The most bytes kiln reads from a text file a user names (an IR module, a tuning database):
/// far more than any it writes, and a bound for a path that never ends (`/dev/zero`, a pipe
/// that keeps writing), which would otherwise take memory until the process is killed.
pub const MAX_TEXT_FILE_BYTES: u64 = 1 << 30;

/// The bytes of the file at `path`, at most `limit` of them.
///
/// # Errors
/// The file's own I/O errors, and [`std::io::ErrorKind::InvalidData`] where it holds more than
/// `limit` bytes (saying so).
pub fn read_bounded(path: &std::path::Path, limit: u64) -> std::io::Result<Vec<u8>> {
    read_bounded_from(std::fs::File::open(path)?, limit)
}

/// What `r` yields to its end, at most `limit` bytes of it (standard input, a file).
///
/// # Errors
/// As [`read_bounded`].
pub fn read_bounded_from(r: impl std::io::Read, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    r.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {limit} bytes, the most kiln reads from such a file"),
        ));
    }
    Ok(out)
}

/// The bytes of the regular file at `path` (a shared library that kiln also `dlopen`s): a
/// device or a pipe is refused before anything is read, so that `/dev/zero` named as a library
/// is an error, not a read that never ends.
///
/// # Errors
/// The file's own I/O errors, and [`std::io::ErrorKind::InvalidInput`] for a path that is not
/// a regular file.
pub fn read_regular_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    // Looked at before it is opened: opening a pipe for reading waits for a writer.
    let not_regular = |meta: &std::fs::Metadata| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "not a regular file (a {})",
                if meta.is_dir() {
                    "directory"
                } else {
                    "device, pipe or socket"
                }
            ),
        )
    };
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let mut f = std::fs::File::open(path)?;
    // And again on what was opened (the path may have been replaced in between).
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    // `read_to_end` reserves with `try_reserve`: a size it cannot have is an error, not an
    // abort.
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

/// [`read_bounded`] as text: UTF-8, or [`std::io::ErrorKind::InvalidData`].
///
/// # Errors
/// As [`read_bounded`], and bytes that are not UTF-8.
pub fn read_text_bounded(path: &std::path::Path, limit: u64) -> std::io::Result<String> {
    utf8(read_bounded(path, limit)?)
}

/// [`read_bounded_from`] as text.
///
/// # Errors
/// As [`read_text_bounded`].
pub fn read_text_bounded_from(r: impl std::io::Read, limit: u64) -> std::io::Result<String> {
    utf8(read_bounded_from(r, limit)?)
}

fn utf8(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text: {e}"),
        )
    })
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

    #[test]
    fn bounded_reads_stop_at_the_limit_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_bounded(&p, 10).unwrap(), b"0123456789");
        assert_eq!(read_text_bounded(&p, 64).unwrap(), "0123456789");
        let e = read_bounded(&p, 9).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 9 bytes"), "{e}");
        // A source that never ends stops at the limit, not at the end of memory.
        let e = read_bounded_from(std::io::repeat(0), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("longer than 1048576 bytes"), "{e}");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let e = read_text_bounded(&p, 64).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        assert_eq!(
            read_bounded(&dir.path().join("missing"), 64)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn only_regular_files_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(read_regular_file(&p).unwrap(), b"abc");
        let e = read_regular_file(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("not a regular file (a directory)"),
            "{e}"
        );
        if std::path::Path::new("/dev/zero").exists() {
            let e = read_regular_file(std::path::Path::new("/dev/zero")).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("device, pipe or socket"), "{e}");
        }
        // A pipe is refused without waiting for a writer.
        let fifo = dir.path().join("fifo");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let e = read_regular_file(&fifo).unwrap_err();
            assert!(e.to_string().contains("device, pipe or socket"), "{e}");
        }
    }
}
