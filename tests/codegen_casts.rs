//! Unsaturated float → integer casts (`"saturate": false`, TVM's conversion) in generated code,
//! against the interpreter's saturating ones: the same value wherever the float fits the
//! integer type, and some value, with the call succeeding, everywhere else (NaN, ±∞, out of
//! range), in serial, vectorized and parallel loops, for every integer type from `float32` and
//! `float64`.

use proptest::prelude::*;

mod common;

use kiln::ir::interp::{cast, fits_int, HostBuffer};
use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc, Stmt, Var};

const N: i64 = 67;

fn program(from: DataType, to: DataType, kind: ForKind) -> PrimFunc {
    let x = Buffer::new("X", from, vec![Expr::from(N)]);
    let y = Buffer::new("Y", to, vec![Expr::from(N)]);
    let i = Var::new("i", DataType::i64());
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::from(0i64),
        extent: Expr::from(N),
        kind,
        body: Box::new(y.store(
            vec![Expr::Var(i.clone())],
            x.load(vec![Expr::Var(i)]).cast_unsaturated(to),
        )),
    };
    PrimFunc::new("f", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true)
}

/// Floats of every kind a conversion meets: small, near each integer type's limits, huge,
/// infinite and NaN.
fn value() -> impl Strategy<Value = f64> {
    let limit = prop_oneof![
        Just(128.0),
        Just(256.0),
        Just(32768.0),
        Just(65536.0),
        Just(2147483648.0),
        Just(4294967296.0),
        Just(9.223372036854776e18),
        Just(1.8446744073709552e19),
    ];
    prop_oneof![
        // Small values fit every integer type but for unsigned negatives: about 38 of each
        // case's 67 draws, half of them fitting even `uint8`.
        4 => -100.0f64..100.0,
        2 => (limit, -2.0f64..2.0, any::<bool>())
            .prop_map(|(l, d, neg)| if neg { -l + d } else { l + d }),
        1 => prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(1e30),
            Just(-1e30),
            Just(-0.0),
        ],
    ]
}

fn int_types() -> impl Strategy<Value = DataType> {
    prop_oneof![
        Just(DataType::i8()),
        Just(DataType::u8()),
        Just(DataType::i16()),
        Just(DataType::u16()),
        Just(DataType::i32()),
        Just(DataType::u32()),
        Just(DataType::i64()),
        Just(DataType::u64()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn unsaturated_casts_agree_where_the_value_fits_and_never_fail_elsewhere(
        wide in any::<bool>(),
        to in int_types(),
        kind in prop_oneof![
            Just(ForKind::Serial),
            Just(ForKind::Vectorized),
            Just(ForKind::Parallel)
        ],
        xs in proptest::collection::vec(value(), N as usize),
    ) {
        let from = if wide { DataType::f64() } else { DataType::f32() };
        let f = program(from, to, kind);
        let input = if wide {
            HostBuffer::from_slice(&[N], &xs)
        } else {
            HostBuffer::from_slice(&[N], &xs.iter().map(|&v| v as f32).collect::<Vec<_>>())
        };
        let out = common::run_jit(&f, &[input.clone(), HostBuffer::zeros(to, &[N])]);
        let got = HostBuffer { data: out[1].clone(), ..HostBuffer::zeros(to, &[N]) };
        let mut fitting = 0;
        for i in 0..N as usize {
            let x = input.get(i).unwrap();
            if !fits_int(to, x.as_f64()) {
                continue;
            }
            fitting += 1;
            prop_assert_eq!(
                got.get(i).unwrap(),
                cast(to, x),
                "{} -> {}: element {} ({})", from, to, i, x.as_f64()
            );
        }
        // Every case compares some values (the small ones fit).
        prop_assert!(fitting > 0, "no value of the case fits {}", to);
    }
}

#[test]
fn fits_int_holds_exactly_the_values_that_truncate_into_range() {
    let i32t = DataType::i32();
    assert!(fits_int(i32t, -2147483648.0) && fits_int(i32t, -2147483648.9));
    assert!(!fits_int(i32t, -2147483649.0) && !fits_int(i32t, 2147483648.0));
    assert!(fits_int(i32t, 2147483647.9) && !fits_int(i32t, f64::NAN));
    assert!(fits_int(DataType::u8(), -0.99) && !fits_int(DataType::u8(), -1.0));
    assert!(fits_int(DataType::u8(), 255.99) && !fits_int(DataType::u8(), 256.0));
    let i64t = DataType::i64();
    assert!(fits_int(i64t, -9.223372036854776e18) && !fits_int(i64t, 9.223372036854776e18));
    assert!(!fits_int(DataType::u64(), 1.8446744073709552e19));
    assert!(!fits_int(i32t, f64::INFINITY) && !fits_int(i32t, f64::NEG_INFINITY));
    // Not an integer target: nothing to fit.
    assert!(fits_int(DataType::f32(), f64::NAN));
}
