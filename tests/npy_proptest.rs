//! The `.npy` reader never panics: arbitrary bytes and mutations of valid files give an array
//! or an error. Half-precision arrays (float16, and bfloat16 in ml_dtypes' convention) round
//! trip.

use kiln::npy::{parse_dtype, NpyArray};
use proptest::prelude::*;

fn valid() -> Vec<u8> {
    let mut a = NpyArray::zeros(parse_dtype("float32").unwrap(), &[3, 5]).unwrap();
    a.data.as_mut_slice()[0] = 7;
    a.to_bytes()
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = NpyArray::from_bytes(&b);
        let mut with_magic = b"\x93NUMPY\x01\x00".to_vec();
        with_magic.extend_from_slice(&b);
        let _ = NpyArray::from_bytes(&with_magic);
    }

    #[test]
    fn mutated_valid_files_never_panic(edits in proptest::collection::vec((0usize..200, any::<u8>()), 1..8)) {
        let mut b = valid();
        for (i, v) in edits {
            let n = b.len();
            b[i % n] = v;
        }
        if let Ok(a) = NpyArray::from_bytes(&b) {
            prop_assert_eq!(a.data.as_slice().len(), a.numel() * a.elem_bytes());
        }
    }

    #[test]
    fn header_text_mutations_never_panic(shape in "[(][0-9, L-]{0,20}[)]?", descr in "[<|=>]?[a-zA-Z][0-9]{0,3}") {
        let h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[0u8; 64]);
        let _ = NpyArray::from_bytes(&b);
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
        prop_assert_eq!(kiln::npy::dtype_name(back.dtype), name);
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
        assert_eq!(kiln::npy::dtype_name(a.dtype), "bfloat16");
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
