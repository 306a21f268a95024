//! The `.npy` reader never panics: arbitrary bytes and mutations of valid files give an array
//! or an error.

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
