//! The `.npy` reader never panics: arbitrary bytes and mutations of valid files give an array
//! or an error. Each call runs under `catch_unwind`, so a panic fails the case with the input
//! instead of unwinding through proptest; headers that claim huge shapes are refused before
//! anything is allocated. Half-precision arrays (float16, and bfloat16 in ml_dtypes'
//! convention) round trip.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::npy::{parse_dtype, NpyArray};
use proptest::prelude::*;

/// Reads `b`, failing the case on a panic; an accepted array has exactly the data its header
/// claims. Says whether it was accepted.
fn read(b: &[u8]) -> Result<bool, TestCaseError> {
    let r = catch_unwind(AssertUnwindSafe(|| NpyArray::from_bytes(b))).map_err(|_| {
        TestCaseError::fail(format!(
            "NpyArray::from_bytes panicked on {:?}",
            String::from_utf8_lossy(&b[..b.len().min(200)])
        ))
    })?;
    if let Ok(a) = &r {
        prop_assert_eq!(a.data.as_slice().len(), a.numel() * a.elem_bytes());
        prop_assert_eq!(a.numel(), a.shape.iter().product::<i64>() as usize);
    }
    Ok(r.is_ok())
}

/// A file with header text `h` (version 1.0, or 2.0/3.0 with a 4-byte length) and `body`.
fn file(version: u8, h: &str, body: &[u8]) -> Vec<u8> {
    let mut b = vec![0x93, b'N', b'U', b'M', b'P', b'Y', version, 0];
    if version == 1 {
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    } else {
        b.extend_from_slice(&(h.len() as u32).to_le_bytes());
    }
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(body);
    b
}

fn valid() -> Vec<u8> {
    let mut a = NpyArray::zeros(parse_dtype("float32").unwrap(), &[3, 5]).unwrap();
    a.data.as_mut_slice()[0] = 7;
    a.to_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        read(&b)?;
        for v in [1u8, 2, 3] {
            let mut with_magic = b"\x93NUMPY".to_vec();
            with_magic.extend_from_slice(&[v, 0]);
            with_magic.extend_from_slice(&b);
            read(&with_magic)?;
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(edits in proptest::collection::vec((0usize..200, any::<u8>()), 1..8)) {
        let mut b = valid();
        for (i, v) in edits {
            let n = b.len();
            b[i % n] = v;
        }
        read(&b)?;
    }

    #[test]
    fn header_text_mutations_never_panic(shape in "[(][0-9, L-]{0,20}[)]?", descr in "[<|=>]?[a-zA-Z][0-9]{0,3}") {
        let h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[0u8; 64]);
        read(&b)?;
    }

    /// Headers whose fields are each plausible or hostile: any dtype, order, huge or negative
    /// extents, many dimensions, a body of any length, version 1, 2 or 3.
    #[test]
    fn hostile_header_fields_never_panic_nor_allocate_what_the_file_lacks(
        version in 1u8..4,
        descr in prop_oneof![
            prop::sample::select(vec!["<f4", "<f8", "|u1", "<i8", ">f4", "<f2", "|b1", "<c8", "O", "", "<U3"]).prop_map(str::to_owned),
            "[<|=>]?[a-zA-Z][0-9]{0,3}",
        ],
        fortran in prop::sample::select(vec!["False", "True", "0", "", "Fals"]),
        dims in proptest::collection::vec(
            prop_oneof![
                0i128..8,
                prop::sample::select(vec![
                    -1i128, 1 << 31, 1 << 32, 1 << 40, 1 << 62, i64::MAX as i128, u64::MAX as i128,
                    i128::MAX,
                ]),
            ],
            0..40,
        ),
        trailing_comma in any::<bool>(),
        body_len in prop_oneof![0usize..64, Just(4096)],
        pad in "[ \n]{0,8}",
    ) {
        let mut shape = dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        if trailing_comma || dims.len() == 1 {
            shape.push(',');
        }
        let h = format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': ({shape}), }}{pad}\n");
        read(&file(version, &h, &vec![1u8; body_len]))?;
    }

    /// Header lengths that point anywhere: past the end, into the magic, zero.
    #[test]
    fn header_lengths_that_lie_never_panic(version in 1u8..4, len in any::<u32>(), extra in 0usize..40) {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
        let mut b = file(version, h, &[0u8; 8]);
        if version == 1 {
            b[8..10].copy_from_slice(&(len as u16).to_le_bytes());
        } else {
            b[8..12].copy_from_slice(&len.to_le_bytes());
        }
        b.truncate(b.len().saturating_sub(extra));
        read(&b)?;
    }
}

#[test]
fn a_header_claiming_terabytes_is_an_error_without_allocating_them() {
    for shape in [
        "(1099511627776,)",
        "(1048576, 1048576)",
        "(4611686018427387904, 4)",
    ] {
        let h = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}\n");
        let e = NpyArray::from_bytes(&file(1, &h, &[0u8; 16])).unwrap_err();
        assert!(
            e.to_string().contains("bytes of data") || e.to_string().contains("too large"),
            "{shape}: {e}"
        );
    }
}

#[test]
fn a_valid_file_round_trips() {
    let a = NpyArray::from_bytes(&valid()).unwrap();
    assert_eq!(a.shape, [3, 5]);
    assert_eq!(a.data.as_slice()[0], 7);
}

proptest! {
    /// float16 (`<f2`) and bfloat16 (`<V2`, ml_dtypes' descr) arrays of any bits and shape
    /// read back bit for bit.
    #[test]
    fn half_precision_arrays_round_trip(
        bf16 in any::<bool>(),
        shape in proptest::collection::vec(0i64..5, 0..4),
        bits in proptest::collection::vec(any::<u16>(), 64),
    ) {
        let name = if bf16 { "bfloat16" } else { "float16" };
        let dtype = parse_dtype(name).unwrap();
        let mut a = NpyArray::zeros(dtype, &shape).unwrap();
        for (chunk, b) in a.data.as_mut_slice().chunks_exact_mut(2).zip(bits.iter().cycle()) {
            chunk.copy_from_slice(&b.to_le_bytes());
        }
        let bytes = a.to_bytes();
        let header = String::from_utf8_lossy(&bytes[10..]).into_owned();
        let descr = if bf16 { "'descr': '<V2'" } else { "'descr': '<f2'" };
        prop_assert!(header.contains(descr), "{}", header);
        let back = NpyArray::from_bytes(&bytes).unwrap();
        prop_assert_eq!(back.dtype, dtype);
        prop_assert_eq!(&back.shape, &shape);
        prop_assert_eq!(back.data.as_slice(), a.data.as_slice());
        prop_assert_eq!(back.dtype.to_string(), name);
    }
}

/// `np.save` of `np.array([1.5, -2, 3.25], dtype=ml_dtypes.bfloat16)` (numpy 2.4, ml_dtypes
/// 0.6), and of the same bits viewed as `V2` (numpy writes `|V2`), read as bfloat16.
#[test]
fn ml_dtypes_bfloat16_files_are_read() {
    for descr in ["<V2", "|V2"] {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (3,), }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[0xc0, 0x3f, 0x00, 0xc0, 0x50, 0x40]);
        let a = NpyArray::from_bytes(&b).unwrap();
        assert_eq!(a.dtype.to_string(), "bfloat16");
        let values: Vec<f32> = a
            .data
            .as_slice()
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert_eq!(values, [1.5, -2.0, 3.25]);
        // kiln writes ml_dtypes' descr, byte for byte the same file for `<V2`.
        if descr == "<V2" {
            assert_eq!(a.to_bytes(), b);
        }
    }
}

/// `set_huge_pages`: arrays of 4 MiB or more are then aligned to 2 MiB (and advised into huge
/// pages where the system has them), zeroed, and freed with their layout; smaller ones keep
/// 64 bytes; the setting reads back and is restored. (Where the THP mode is `madvise` and a huge
/// page was free, the mapping shows `AnonHugePages`; printed, not asserted: memory may be too
/// fragmented for one.)
#[test]
fn huge_pages_align_large_arrays_and_keep_them_zeroed() {
    use kiln::npy::{huge_pages, set_huge_pages, AlignedBytes, HUGE_PAGE_MIN_BYTES};
    let before = set_huge_pages(true);
    assert!(huge_pages());
    for len in [HUGE_PAGE_MIN_BYTES, HUGE_PAGE_MIN_BYTES * 3 + 12345] {
        let mut b = AlignedBytes::zeroed(len).unwrap();
        let p = b.as_slice().as_ptr() as usize;
        if cfg!(target_os = "linux") {
            assert_eq!(p % (2 << 20), 0, "{len} bytes at {p:#x}");
        }
        assert!(b.as_slice().iter().all(|&x| x == 0), "{len}");
        b.as_mut_slice()[len - 1] = 7;
        assert_eq!(b.as_slice()[len - 1], 7);
        if let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") {
            let huge: u64 = smaps
                .lines()
                .filter_map(|l| l.strip_prefix("AnonHugePages:"))
                .filter_map(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .sum();
            eprintln!("{len} bytes: AnonHugePages in this process {huge} kB");
        }
    }
    let small = AlignedBytes::zeroed(HUGE_PAGE_MIN_BYTES - 1).unwrap();
    assert_eq!(small.as_slice().as_ptr() as usize % 64, 0);
    let f32 =
        kiln::packed_func::DLDataType::new(kiln::packed_func::ffi::DLDataTypeCode::FLOAT, 32, 1);
    let a = NpyArray::zeros(f32, &[1024, 1024 + 3]).unwrap();
    if cfg!(target_os = "linux") {
        assert_eq!(a.data.as_slice().as_ptr() as usize % (2 << 20), 0);
    }
    set_huge_pages(before);
    assert_eq!(huge_pages(), before);
}

/// `NpyArray::read(path)` of the bytes `b` written to a file, under `catch_unwind`.
fn read_file(b: &[u8]) -> Result<Result<NpyArray, String>, TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    std::fs::write(&p, b).unwrap();
    catch_unwind(AssertUnwindSafe(|| NpyArray::read(&p)))
        .map(|r| r.map_err(|e| e.to_string()))
        .map_err(|_| TestCaseError::fail("NpyArray::read panicked"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Reading a file (its header first, then as many bytes as the header says and one more)
    /// accepts exactly the files `from_bytes` accepts, with the same array: valid files cut
    /// short, lengthened, and mutated anywhere, in every version.
    #[test]
    fn reading_a_file_agrees_with_reading_its_bytes(
        version in 1u8..=3,
        cut in 0usize..120,
        extra in proptest::collection::vec(any::<u8>(), 0..4),
        flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..3),
    ) {
        let v = valid();
        let header = String::from_utf8_lossy(&v[10..v.len() - 60]).into_owned();
        let mut b = file(version, &header, &v[v.len() - 60..]);
        for (at, x) in flips {
            if let Some(byte) = b.get_mut(at) {
                *byte ^= x;
            }
        }
        let b: Vec<u8> = if cut % 3 == 0 {
            b[..b.len().saturating_sub(cut)].to_vec()
        } else {
            b.into_iter().chain(extra).collect()
        };
        let from_bytes = NpyArray::from_bytes(&b).map_err(|e| e.to_string());
        let from_file = read_file(&b)?;
        match (&from_bytes, &from_file) {
            (Ok(x), Ok(y)) => {
                prop_assert_eq!(&x.shape, &y.shape);
                prop_assert_eq!(x.data.as_slice(), y.data.as_slice());
            }
            (Err(_), Err(e)) => prop_assert!(e.contains("a.npy"), "{}", e),
            _ => prop_assert!(false, "bytes {:?}, file {:?}", from_bytes.is_ok(), from_file.is_ok()),
        }
    }
}

/// A path that never ends is read only as far as a file of the right length would be: its
/// header, first (`/dev/zero` has no magic), then the data the header claims and a byte more.
#[test]
fn a_path_that_never_ends_is_not_read_to_its_end() {
    if std::path::Path::new("/dev/zero").exists() {
        let e = NpyArray::read(std::path::Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("not a .npy file"), "{e}");
    }
    // A valid header followed by an endless stream: a FIFO fed more than the data.
    #[cfg(unix)]
    {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe.npy");
        let ok = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            let v = valid();
            let writer = {
                let p = p.clone();
                std::thread::spawn(move || {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                    let _ = f.write_all(&v);
                    // Then zeros until the reader is gone (a broken pipe ends it).
                    let zeros = vec![0u8; 1 << 16];
                    while f.write_all(&zeros).is_ok() {}
                })
            };
            let e = NpyArray::read(&p).unwrap_err();
            assert!(e.to_string().contains("expected 60 bytes of data"), "{e}");
            writer.join().unwrap();
        }
    }
}
