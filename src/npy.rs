//! Reading and writing NumPy `.npy` files (format versions 1.0, 2.0 and 3.0), for `kiln run` and
//! tests: host arrays that can be viewed as `DLTensor`s.
//!
//! Only what tensors need is supported: little-endian (or one-byte) numeric dtypes
//! (`b1 i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8`, float16 being numpy's `<f2`), C order, any shape.
//! Fortran-ordered files are rejected with a message rather than silently transposed. Data is
//! kept 64-byte aligned.
//!
//! `.npy` has no bfloat16. kiln follows `ml_dtypes` (what JAX and TensorFlow use): `np.save` of
//! an `ml_dtypes.bfloat16` array writes the descr `'<V2'` (two opaque bytes) with the raw
//! little-endian bfloat16 bits, so kiln writes bfloat16 as `'<V2'`, and reads `'<V2'` and
//! `'|V2'` (what numpy itself writes for `a.view('V2')`) as bfloat16. In Python:
//! `np.load(p).view(ml_dtypes.bfloat16)` reads kiln's file (or `.view(np.uint16)` for the
//! bits); `np.save(p, a)` with an `ml_dtypes.bfloat16` array writes one kiln reads.
//!
//! Memory: like numpy's arrays, kiln's can be asked to live in transparent huge pages
//! ([`set_huge_pages`], numpy's `_set_madvise_hugepage`, which numpy turns on by default): an
//! array of 4 MiB or more is then aligned to 2 MiB and advised (`madvise(MADV_HUGEPAGE)`) before
//! its pages are first touched. A kernel that streams a large operand can run at another speed
//! in 2 MiB pages than in 4 KiB ones, so `kiln tune --huge-pages` measures in the pages the
//! tensors will have. Off by default: TVM's and PyTorch's allocators do not ask for them.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

static HUGE_PAGES: AtomicBool = AtomicBool::new(false);

/// Arrays of at least this many bytes go in huge pages when [`set_huge_pages`] asks for them
/// (numpy's threshold).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// A transparent huge page on x86-64 and most Linux systems.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Whether arrays allocated from now on (of [`HUGE_PAGE_MIN_BYTES`] or more) are advised into
/// transparent huge pages, for this process; returns the previous setting. Only Linux has the
/// advice; elsewhere it is a no-op. Where the system's THP mode is `never`, the advice changes
/// nothing; where it is `always`, every large array is in huge pages anyway.
pub fn set_huge_pages(on: bool) -> bool {
    HUGE_PAGES.swap(on, Ordering::SeqCst)
}

/// The setting of [`set_huge_pages`].
pub fn huge_pages() -> bool {
    HUGE_PAGES.load(Ordering::SeqCst)
}

#[cfg(target_os = "linux")]
extern "C" {
    fn madvise(addr: *mut c_void, len: usize, advice: std::ffi::c_int) -> std::ffi::c_int;
}

/// Linux's `MADV_HUGEPAGE`.
#[cfg(target_os = "linux")]
const MADV_HUGEPAGE: std::ffi::c_int = 14;

use crate::packed_func::ffi::{DLDataTypeCode, DLDeviceType};
use crate::packed_func::{DLDataType, DLDevice, DLTensor};

/// Errors of reading `.npy` data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("npy: {0}")]
pub struct NpyError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError(msg.into()))
}

/// A compact CPU `DLTensor` of `dtype` and `shape` at `data`; valid while `data` and `shape`
/// are neither moved nor freed.
pub fn cpu_dltensor(data: *mut u8, dtype: DLDataType, shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data: data.cast::<c_void>(),
        device: DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// Bytes aligned to 64 (to 2 MiB when in huge pages: [`set_huge_pages`]).
pub struct AlignedBytes {
    ptr: *mut u8,
    len: usize,
    align: usize,
}

// SAFETY: `AlignedBytes` uniquely owns its allocation, like a `Vec<u8>`.
unsafe impl Send for AlignedBytes {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zero bytes (at least one byte is allocated).
    ///
    /// # Errors
    /// When the allocation fails or `len` is absurd.
    pub fn zeroed(len: usize) -> Result<Self, NpyError> {
        let huge = cfg!(target_os = "linux") && len >= HUGE_PAGE_MIN_BYTES && huge_pages();
        let align = if huge { HUGE_PAGE_BYTES } else { 64 };
        let layout = Layout::from_size_align(len.max(1), align)
            .map_err(|_| NpyError(format!("cannot allocate {len} bytes")))?;
        let ptr = if huge {
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { alloc(layout) };
            if !ptr.is_null() {
                // The advice before the first touch, so that the first faults map huge pages;
                // a system without them refuses it, which changes nothing.
                #[cfg(target_os = "linux")]
                // SAFETY: `ptr .. ptr + len` is this allocation, aligned to a huge page.
                unsafe {
                    madvise(
                        ptr.cast(),
                        len / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES,
                        MADV_HUGEPAGE,
                    );
                }
                // SAFETY: `ptr` owns `len` writable bytes.
                unsafe { std::ptr::write_bytes(ptr, 0, len) };
            }
            ptr
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { alloc_zeroed(layout) }
        };
        if ptr.is_null() {
            return err(format!("out of memory allocating {len} bytes"));
        }
        Ok(AlignedBytes { ptr, len, align })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `len` initialized bytes, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(1), self.align),
            )
        };
    }
}

/// A host array: dtype, shape and 64-byte-aligned data.
pub struct NpyArray {
    /// Element type.
    pub dtype: DLDataType,
    /// Extents.
    pub shape: Vec<i64>,
    /// The elements, C order.
    pub data: AlignedBytes,
}

impl std::fmt::Debug for NpyArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NpyArray({}, {:?})", self.dtype, self.shape)
    }
}

const TABLE: &[(&str, u8, u8, &str)] = &[
    ("|b1", 6, 8, "bool"),
    ("|i1", 0, 8, "int8"),
    ("<i2", 0, 16, "int16"),
    ("<i4", 0, 32, "int32"),
    ("<i8", 0, 64, "int64"),
    ("|u1", 1, 8, "uint8"),
    ("<u2", 1, 16, "uint16"),
    ("<u4", 1, 32, "uint32"),
    ("<u8", 1, 64, "uint64"),
    ("<f2", 2, 16, "float16"),
    ("<f4", 2, 32, "float32"),
    ("<f8", 2, 64, "float64"),
    // No standard descr: ml_dtypes' (see the module documentation).
    ("<V2", 4, 16, "bfloat16"),
];

/// The dtype named `float32`, `int64`, `bool`, ...
pub fn parse_dtype(name: &str) -> Option<DLDataType> {
    TABLE.iter().find(|t| t.3 == name).map(|t| DLDataType {
        code: DLDataTypeCode(t.1),
        bits: t.2,
        lanes: 1,
    })
}

impl NpyArray {
    /// A zero-filled array.
    ///
    /// # Errors
    /// Negative extents, overflowing sizes, allocation failure.
    pub fn zeros(dtype: DLDataType, shape: &[i64]) -> Result<Self, NpyError> {
        let n = numel(shape)?;
        let bytes = n
            .checked_mul(usize::from(dtype.bits).div_ceil(8))
            .ok_or_else(|| NpyError("array too large".into()))?;
        Ok(NpyArray {
            dtype,
            shape: shape.to_vec(),
            data: AlignedBytes::zeroed(bytes)?,
        })
    }

    /// Element size in bytes.
    pub fn elem_bytes(&self) -> usize {
        usize::from(self.dtype.bits).div_ceil(8)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len / self.elem_bytes().max(1)
    }

    /// A `DLTensor` view (CPU, compact) of this array; valid while `self` is neither moved out
    /// of nor dropped.
    pub fn as_dltensor(&mut self) -> DLTensor {
        cpu_dltensor(self.data.ptr, self.dtype, &mut self.shape)
    }

    /// Reads `.npy` bytes.
    ///
    /// # Errors
    /// A message naming what is wrong: magic, version, header, dtype, order, shape or size.
    pub fn from_bytes(b: &[u8]) -> Result<Self, NpyError> {
        let h = Header::parse(b)?;
        let body = &b[h.end..];
        if body.len() != h.want {
            return err(format!(
                "expected {} bytes of data for shape {:?} {}, found {}",
                h.want,
                h.shape,
                h.descr,
                body.len()
            ));
        }
        let mut a = NpyArray::zeros(h.dtype, &h.shape)?;
        a.data.as_mut_slice().copy_from_slice(body);
        Ok(a)
    }
}

/// Where a `.npy` header's text starts and its length, from the bytes before it (version 1.0:
/// a 2-byte length, the text from byte 10; 2.0 and 3.0: a 4-byte length, from byte 12), or
/// `None` for another version or too few bytes.
fn header_span(b: &[u8]) -> Option<(usize, usize)> {
    match *b.get(6)? {
        1 if b.len() >= 10 => Some((10, usize::from(u16::from_le_bytes([b[8], b[9]])))),
        2 | 3 if b.len() >= 12 => {
            let n = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
            Some((12, usize::try_from(n).unwrap_or(usize::MAX)))
        }
        _ => None,
    }
}

/// A `.npy` header: where the data starts, and what it holds.
struct Header {
    /// The offset of the data.
    end: usize,
    dtype: DLDataType,
    shape: Vec<i64>,
    /// The data's length in bytes.
    want: usize,
    /// The dtype as the table writes it (for messages).
    descr: &'static str,
}

impl Header {
    /// The header at the start of `b` (which may hold only the header, or more).
    fn parse(b: &[u8]) -> Result<Header, NpyError> {
        if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
            return err("not a .npy file (missing the \\x93NUMPY magic)");
        }
        let Some((start, hlen)) = header_span(b) else {
            return err(format!(
                "unsupported .npy version {}.{} (expected 1.0, 2.0 or 3.0)",
                b[6], b[7]
            ));
        };
        let end = start
            .checked_add(hlen)
            .filter(|&e| e <= b.len())
            .ok_or_else(|| NpyError("header longer than the file".into()))?;
        let header = std::str::from_utf8(&b[start..end])
            .map_err(|_| NpyError("header is not text".into()))?;
        let descr = dict_str(header, "descr")?;
        let fortran = dict_raw(header, "fortran_order")?;
        if fortran.starts_with("True") {
            return err(
                "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)",
            );
        }
        if !fortran.starts_with("False") {
            return err(format!(
                "fortran_order must be True or False, found `{fortran}`"
            ));
        }
        let descr_norm = descr.replace('=', "<");
        let descr_norm = if descr_norm == "<b1" || descr_norm == "<i1" || descr_norm == "<u1" {
            descr_norm.replacen('<', "|", 1)
        } else if descr_norm == "|V2" {
            // Opaque bytes have no byte order: numpy writes `|V2` for `a.view('V2')`.
            "<V2".to_owned()
        } else {
            descr_norm
        };
        let Some(t) = TABLE.iter().find(|t| t.0 == descr_norm) else {
            return err(format!(
                "unsupported dtype `{descr}` (expected one of {})",
                TABLE.iter().map(|t| t.0).collect::<Vec<_>>().join(" ")
            ));
        };
        let shape = parse_shape(dict_raw(header, "shape")?)?;
        let dtype = DLDataType {
            code: DLDataTypeCode(t.1),
            bits: t.2,
            lanes: 1,
        };
        // The size the header claims is checked against the file before anything is allocated:
        // a header may claim terabytes.
        let want = numel(&shape)?
            .checked_mul(usize::from(dtype.bits).div_ceil(8))
            .ok_or_else(|| NpyError(format!("shape {shape:?} is too large")))?;
        Ok(Header {
            end,
            dtype,
            shape,
            want,
            descr: t.3,
        })
    }
}

impl NpyArray {
    /// Reads a `.npy` file.
    ///
    /// # Errors
    /// I/O errors and format errors, with the path.
    pub fn read(path: &std::path::Path) -> Result<Self, NpyError> {
        use std::io::Read;
        let io = |e: std::io::Error| NpyError(format!("reading `{}`: {e}", path.display()));
        let at = |e: NpyError| NpyError(format!("`{}`: {}", path.display(), e.0));
        // The header first, then as many bytes as it says the data holds and one more (to see
        // a file that is longer): a path that never ends (`/dev/zero`, a pipe that keeps
        // writing) is read no further than a file of the right length would be.
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut b = Vec::new();
        (&mut f).take(12).read_to_end(&mut b).map_err(io)?;
        let end = header_span(&b).map_or(0, |(start, hlen)| start.saturating_add(hlen));
        let rest = (end as u64).saturating_sub(b.len() as u64);
        (&mut f).take(rest).read_to_end(&mut b).map_err(io)?;
        let h = Header::parse(&b).map_err(at)?;
        let have = b.len() - h.end.min(b.len());
        let more = (h.want as u64)
            .saturating_sub(have as u64)
            .saturating_add(1);
        f.take(more).read_to_end(&mut b).map_err(io)?;
        Self::from_bytes(&b).map_err(at)
    }

    /// The `.npy` (version 1.0) bytes of this array.
    pub fn to_bytes(&self) -> Vec<u8> {
        let descr = TABLE
            .iter()
            .find(|t| t.1 == self.dtype.code.0 && t.2 == self.dtype.bits)
            .map_or("|V1", |t| t.0);
        let shape = match self.shape.len() {
            1 => format!("({},)", self.shape[0]),
            _ => format!(
                "({})",
                self.shape
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut out = Vec::with_capacity(10 + h.len() + self.data.len);
        out.extend_from_slice(b"\x93NUMPY\x01\x00");
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(self.data.as_slice());
        out
    }

    /// Writes a `.npy` file.
    ///
    /// # Errors
    /// I/O errors, with the path.
    pub fn write(&self, path: &std::path::Path) -> Result<(), NpyError> {
        std::fs::write(path, self.to_bytes())
            .map_err(|e| NpyError(format!("writing `{}`: {e}", path.display())))
    }
}

fn numel(shape: &[i64]) -> Result<usize, NpyError> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d)
            .map_err(|_| NpyError(format!("negative extent {d} in shape {shape:?}")))?;
        acc.checked_mul(d)
            .ok_or_else(|| NpyError(format!("shape {shape:?} is too large")))
    })
}

/// The raw text after `'key':` in a Python dict literal.
fn dict_raw<'a>(h: &'a str, key: &str) -> Result<&'a str, NpyError> {
    let pat = format!("'{key}':");
    let i = h
        .find(&pat)
        .ok_or_else(|| NpyError(format!("header has no `{key}`")))?;
    Ok(h[i + pat.len()..].trim_start())
}

fn dict_str<'a>(h: &'a str, key: &str) -> Result<&'a str, NpyError> {
    let r = dict_raw(h, key)?;
    let r = r
        .strip_prefix('\'')
        .ok_or_else(|| NpyError(format!("`{key}` is not a string")))?;
    let end = r
        .find('\'')
        .ok_or_else(|| NpyError(format!("`{key}` is not a closed string")))?;
    Ok(&r[..end])
}

fn parse_shape(r: &str) -> Result<Vec<i64>, NpyError> {
    let r = r
        .strip_prefix('(')
        .ok_or_else(|| NpyError("shape is not a tuple".into()))?;
    let end = r
        .find(')')
        .ok_or_else(|| NpyError("shape tuple is not closed".into()))?;
    let mut dims = Vec::new();
    for part in r[..end].split(',') {
        let p = part.trim().trim_end_matches('L');
        if p.is_empty() {
            continue;
        }
        let d: i64 = p
            .parse()
            .map_err(|_| NpyError(format!("shape entry `{p}` is not an integer")))?;
        if d < 0 {
            return err(format!("negative extent {d} in shape"));
        }
        dims.push(d);
    }
    if dims.len() > 32 {
        return err(format!("{} dimensions (at most 32)", dims.len()));
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_float32_arrays() {
        let mut a = NpyArray::zeros(parse_dtype("float32").unwrap(), &[2, 3]).unwrap();
        a.data.as_mut_slice()[..4].copy_from_slice(&1.5f32.to_le_bytes());
        let b = NpyArray::from_bytes(&a.to_bytes()).unwrap();
        assert_eq!(b.shape, [2, 3]);
        assert_eq!(b.data.as_slice(), a.data.as_slice());
        assert_eq!(
            (a.to_bytes().len() - a.data.as_slice().len()) % 64,
            0,
            "header padded to 64"
        );
    }

    #[test]
    fn rejects_bad_files_with_a_reason() {
        assert!(NpyArray::from_bytes(b"hello")
            .unwrap_err()
            .0
            .contains("magic"));
        let mut a = NpyArray::zeros(parse_dtype("int32").unwrap(), &[4])
            .unwrap()
            .to_bytes();
        a.pop();
        assert!(NpyArray::from_bytes(&a)
            .unwrap_err()
            .0
            .contains("expected 16 bytes of data"));
        let f = b"\x93NUMPY\x01\x00\x40\x00{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }          \n";
        assert!(NpyArray::from_bytes(f).unwrap_err().0.contains("Fortran"));
        let c = b"\x93NUMPY\x01\x00\x40\x00{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }         \n";
        assert!(NpyArray::from_bytes(c)
            .unwrap_err()
            .0
            .contains("unsupported dtype `<c8`"));
    }

    #[test]
    fn never_panics_on_truncations_of_a_valid_file() {
        let a = NpyArray::zeros(parse_dtype("float64").unwrap(), &[3, 2])
            .unwrap()
            .to_bytes();
        for n in 0..a.len() {
            let _ = NpyArray::from_bytes(&a[..n]);
        }
    }
}
