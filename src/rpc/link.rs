//! Objects a client uploads instead of a shared library: a `.o`, or a `.tar` of them (what TVM's
//! `export_library(fcompile=tar)` and MetaSchedule's default builder write). The server links
//! them into a `.so` with the system's C compiler (`$CC`, else `cc`), as TVM's server does.
//!
//! The tar reader is kiln's own and takes regular files with plain names only: a member named
//! with a `/`, a `..`, or of any other type (links, devices) is refused, so an archive cannot
//! write outside the folder it is unpacked into.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The regular files of a ustar/GNU tar archive: `(name, contents)`.
///
/// # Errors
/// A truncated or malformed header, a member that is not a regular file with a plain name.
pub fn tar_members(data: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 512 <= data.len() {
        let h = &data[pos..pos + 512];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let field = |a: usize, b: usize| {
            let f = &h[a..b];
            let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).trim().to_owned()
        };
        let name = field(0, 100);
        let size_text = field(124, 136);
        let size = u64::from_str_radix(
            if size_text.is_empty() {
                "0"
            } else {
                &size_text
            },
            8,
        )
        .map_err(|_| format!("tar member `{name}`: size `{size_text}` is not octal"))?;
        let kind = h[156];
        let start = pos + 512;
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| start.checked_add(s))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                format!(
                    "tar member `{name}`: {size} bytes at offset {start} run past the archive's \
                     {} bytes",
                    data.len()
                )
            })?;
        match kind {
            b'0' | 0 => {
                let plain = name.strip_prefix("./").unwrap_or(&name);
                if plain.is_empty() || plain.contains('/') || plain == "." || plain == ".." {
                    return Err(format!(
                        "tar member `{name}`: only plain file names are unpacked (no folders, \
                         no `..`)"
                    ));
                }
                out.push((plain.to_owned(), &data[start..end]));
            }
            // The `./` folder entry of `tar -C dir .`, and pax headers: nothing to unpack.
            b'5' if name == "./" || name == "." => {}
            b'x' | b'g' => {}
            other => {
                return Err(format!(
                    "tar member `{name}`: type `{}` is not a regular file; only regular files are \
                     unpacked",
                    other as char
                ))
            }
        }
        pos = start + (end - start).div_ceil(512) * 512;
    }
    Ok(out)
}

/// The bytes of an archive as uploaded: gzip-compressed (as TVM writes them) or plain. At most
/// `limit` bytes are unpacked.
///
/// # Errors
/// A corrupt stream, or one that unpacks past `limit`.
pub fn maybe_gunzip(data: &[u8], limit: u64) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    use std::io::Read;
    if !data.starts_with(&[0x1f, 0x8b]) {
        return Ok(std::borrow::Cow::Borrowed(data));
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the gzip stream is corrupt: {e}"))?;
    if out.len() as u64 > limit {
        return Err(format!("the archive unpacks to more than {limit} bytes"));
    }
    Ok(std::borrow::Cow::Owned(out))
}

/// Links `objects` into the shared library `out`.
///
/// # Errors
/// No compiler, or the compiler's own message.
pub fn link_shared(objects: &[PathBuf], out: &Path) -> Result<(), String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let res = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .args(objects)
        .output()
        .map_err(|e| {
            format!("linking needs a C compiler (`{cc}`, or $CC), which could not run: {e}")
        })?;
    if !res.status.success() {
        return Err(format!(
            "`{cc} -shared` failed ({}): {}",
            res.status,
            String::from_utf8_lossy(&res.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, size: usize, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let s = format!("{size:011o}");
        h[124..135].copy_from_slice(s.as_bytes());
        h[156] = kind;
        h
    }

    fn archive(members: &[(&str, &[u8], u8)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, d, k) in members {
            out.extend(header(n, d.len(), *k));
            out.extend_from_slice(d);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend(vec![0u8; 1024]);
        out
    }

    #[test]
    fn regular_files_are_read() {
        let a = archive(&[
            ("./", b"", b'5'),
            ("./lib0.o", b"abc", b'0'),
            ("devc.o", &[7; 600], b'0'),
        ]);
        let m = tar_members(&a).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0], ("lib0.o".to_owned(), &b"abc"[..]));
        assert_eq!(m[1].1.len(), 600);
    }

    #[test]
    fn escapes_and_links_are_refused() {
        let e = tar_members(&archive(&[("../x.o", b"a", b'0')])).unwrap_err();
        assert!(e.contains("plain file names"), "{e}");
        let e = tar_members(&archive(&[("x.o", b"", b'2')])).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let mut a = archive(&[("x.o", &[1; 100], b'0')]);
        a.truncate(600);
        let e = tar_members(&a).unwrap_err();
        assert!(e.contains("run past"), "{e}");
    }
}
