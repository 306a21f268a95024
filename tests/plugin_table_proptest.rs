//! The plugin loader's checks of a library's function table (`sys::check_table`, the pure part
//! of `load_plugin` that runs on the bytes copied out of the plugin) never panic: arbitrary
//! bytes, and valid tables with mutated sizes, versions, truncations and NULL entries, give a
//! checked table or an error, and the answer agrees with a model of the rules (major version 1,
//! at least ABI 1.0's size, every required entry present, allocate entries paired with their
//! deallocate).

use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::device_api::plugin::sys::{
    self, check_table, KilnDeviceInterface, TableCheck, TableProblem, KILN_DEVICE_INTERFACE_SIZE,
    KILN_DEVICE_INTERFACE_SIZE_1_0, KILN_PLUGIN_ABI_MAJOR, KILN_PLUGIN_ABI_MINOR,
};
use proptest::prelude::*;

const N: usize = size_of::<KilnDeviceInterface>();

/// The required entries, by name and offset (the loader's list, `sys::required_entries`).
fn required() -> Vec<(&'static str, usize)> {
    let v = vec![
        (
            "get_device_count",
            offset_of!(KilnDeviceInterface, get_device_count),
        ),
        (
            "device_memory_allocate",
            offset_of!(KilnDeviceInterface, device_memory_allocate),
        ),
        (
            "device_memory_deallocate",
            offset_of!(KilnDeviceInterface, device_memory_deallocate),
        ),
        (
            "memory_copy_h2d",
            offset_of!(KilnDeviceInterface, memory_copy_h2d),
        ),
        (
            "memory_copy_d2h",
            offset_of!(KilnDeviceInterface, memory_copy_d2h),
        ),
        (
            "memory_copy_d2d",
            offset_of!(KilnDeviceInterface, memory_copy_d2d),
        ),
        (
            "create_stream",
            offset_of!(KilnDeviceInterface, create_stream),
        ),
        (
            "destroy_stream",
            offset_of!(KilnDeviceInterface, destroy_stream),
        ),
        (
            "synchronize_stream",
            offset_of!(KilnDeviceInterface, synchronize_stream),
        ),
        (
            "stream_wait_event",
            offset_of!(KilnDeviceInterface, stream_wait_event),
        ),
        (
            "create_event",
            offset_of!(KilnDeviceInterface, create_event),
        ),
        (
            "destroy_event",
            offset_of!(KilnDeviceInterface, destroy_event),
        ),
        (
            "record_event",
            offset_of!(KilnDeviceInterface, record_event),
        ),
        (
            "synchronize_event",
            offset_of!(KilnDeviceInterface, synchronize_event),
        ),
    ];
    assert_eq!(
        v.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        sys::required_entries().collect::<Vec<_>>(),
        "the model's list is the loader's"
    );
    v
}

/// Optional pairs: an allocate entry without its deallocate is refused.
fn pairs() -> [(usize, usize); 2] {
    [
        (
            offset_of!(KilnDeviceInterface, host_memory_allocate),
            offset_of!(KilnDeviceInterface, host_memory_deallocate),
        ),
        (
            offset_of!(KilnDeviceInterface, unified_memory_allocate),
            offset_of!(KilnDeviceInterface, unified_memory_deallocate),
        ),
    ]
}

/// Today's table with every entry set to a distinct non-NULL (never called) value.
fn valid() -> Vec<u8> {
    let mut b = vec![0u8; N];
    b[..8].copy_from_slice(&KILN_DEVICE_INTERFACE_SIZE.to_ne_bytes());
    b[8..12].copy_from_slice(&KILN_PLUGIN_ABI_MAJOR.to_ne_bytes());
    b[12..16].copy_from_slice(&KILN_PLUGIN_ABI_MINOR.to_ne_bytes());
    for (k, off) in (16..N).step_by(8).enumerate() {
        b[off..off + 8].copy_from_slice(&(0x1000usize + 16 * k).to_ne_bytes());
    }
    b
}

fn word(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    for (i, x) in w.iter_mut().enumerate() {
        *x = b.get(off + i).copied().unwrap_or(0);
    }
    u64::from_ne_bytes(w)
}

/// Calls the check, failing the case (instead of the process) on a panic.
fn checked(b: &[u8]) -> Result<Result<TableCheck, TableProblem>, TestCaseError> {
    catch_unwind(AssertUnwindSafe(|| check_table(b)))
        .map_err(|_| TestCaseError::fail(format!("check_table panicked on {} bytes", b.len())))
}

/// The model: what the loader must answer for these bytes.
fn agrees_with_model(b: &[u8]) -> Result<(), TestCaseError> {
    let r = checked(b)?;
    let size = word(b, 0) as usize;
    let major = word(b, 8) as u32;
    let missing: Vec<&str> = required()
        .into_iter()
        .filter(|&(_, off)| word(b, off) == 0)
        .map(|(n, _)| n)
        .collect();
    let half_pairs = pairs()
        .iter()
        .filter(|&&(a, d)| word(b, a) != 0 && word(b, d) == 0)
        .count();
    match r {
        Ok(t) => {
            prop_assert_eq!(t.abi.0, KILN_PLUGIN_ABI_MAJOR);
            prop_assert!(size >= KILN_DEVICE_INTERFACE_SIZE_1_0);
            prop_assert_eq!(t.table_size, size);
            prop_assert!(
                missing.is_empty() && half_pairs == 0,
                "accepted with {missing:?}"
            );
        }
        Err(TableProblem::Version { abi, reason }) => {
            prop_assert!(!reason.is_empty());
            prop_assert_eq!(abi.0, major);
            prop_assert!(major != KILN_PLUGIN_ABI_MAJOR || size < KILN_DEVICE_INTERFACE_SIZE_1_0);
        }
        Err(TableProblem::MissingEntries(m)) => {
            prop_assert_eq!(major, KILN_PLUGIN_ABI_MAJOR);
            prop_assert!(size >= KILN_DEVICE_INTERFACE_SIZE_1_0);
            prop_assert_eq!(
                m.len(),
                missing.len() + half_pairs,
                "{:?} vs {:?}",
                m,
                missing
            );
            for n in missing {
                prop_assert!(m.contains(&n), "{} not named in {:?}", n, m);
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    /// Set a byte.
    Byte(usize, u8),
    /// NULL an entry (by slot index).
    Null(usize),
    /// Declare another size.
    Size(usize),
    /// Declare another version.
    Version(u32, u32),
    /// Keep only a prefix (what an older, smaller table gives).
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let sizes = prop_oneof![
        Just(0usize),
        Just(8),
        Just(KILN_DEVICE_INTERFACE_SIZE_1_0 - 1),
        Just(KILN_DEVICE_INTERFACE_SIZE_1_0),
        Just(KILN_DEVICE_INTERFACE_SIZE),
        Just(KILN_DEVICE_INTERFACE_SIZE + 8),
        Just(usize::MAX),
        any::<usize>(),
    ];
    prop_oneof![
        (0..N, any::<u8>()).prop_map(|(i, v)| Edit::Byte(i, v)),
        (0..(N - 16) / 8).prop_map(Edit::Null),
        sizes.prop_map(Edit::Size),
        (
            prop_oneof![Just(0u32), Just(1), Just(2), any::<u32>()],
            0u32..4
        )
            .prop_map(|(a, b)| Edit::Version(a, b)),
        (0..N + 8).prop_map(Edit::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_follow_the_rules(b in proptest::collection::vec(any::<u8>(), 0..N + 64)) {
        agrees_with_model(&b)?;
    }

    #[test]
    fn mutated_valid_tables_never_panic_and_follow_the_rules(edits in proptest::collection::vec(edit(), 1..6)) {
        let mut b = valid();
        for e in edits {
            match e {
                Edit::Byte(i, v) => if i < b.len() { b[i] = v },
                Edit::Null(k) => {
                    let off = 16 + 8 * k;
                    if off + 8 <= b.len() { b[off..off + 8].fill(0) }
                }
                Edit::Size(s) => if b.len() >= 8 { b[..8].copy_from_slice(&s.to_ne_bytes()) },
                Edit::Version(a, m) => if b.len() >= 16 {
                    b[8..12].copy_from_slice(&a.to_ne_bytes());
                    b[12..16].copy_from_slice(&m.to_ne_bytes());
                },
                Edit::Truncate(n) => b.truncate(n),
            }
        }
        agrees_with_model(&b)?;
    }
}

#[test]
fn the_valid_table_passes_and_an_abi_1_0_table_lacks_the_newer_entries() {
    let t = check_table(&valid()).unwrap();
    assert_eq!(t.abi, (KILN_PLUGIN_ABI_MAJOR, KILN_PLUGIN_ABI_MINOR));
    assert!(t.absent_entries.is_empty(), "{:?}", t.absent_entries);
    let mut old = valid();
    old.truncate(KILN_DEVICE_INTERFACE_SIZE_1_0);
    old[..8].copy_from_slice(&KILN_DEVICE_INTERFACE_SIZE_1_0.to_ne_bytes());
    let t = check_table(&old).unwrap();
    assert_eq!(
        t.absent_entries,
        ["get_attribute", "get_kernels", "async_memory_set"]
    );
    assert!(matches!(
        check_table(&[]),
        Err(TableProblem::Version { abi: (0, 0), .. })
    ));
}
