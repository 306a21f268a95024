//! Copy nests as one `memcpy` (`codegen/llvm/emit/copy.rs`): a nest that copies a contiguous
//! region into another becomes one call, with the right addresses and size for any element
//! type, and every nest outside the rule stays loops. Each function's result is compared byte
//! for byte with the reference interpreter's.

mod common;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::builder::{for_range, int};
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt};
use kiln::packed_func::Module;

/// The number of lines of `f`'s optimized LLVM IR that contain `text`.
fn lines_with(f: &PrimFunc, text: &str) -> usize {
    let m = LlvmModule::jit(
        &IRModule::from_functions(vec![f.clone()]),
        &CodegenOptions::host(),
    )
    .unwrap();
    m.get_source("ll")
        .unwrap()
        .lines()
        .filter(|l| l.contains(text))
        .count()
}

/// The number of `memcpy` calls in `f`'s optimized LLVM IR.
fn memcpys(f: &PrimFunc) -> usize {
    lines_with(f, "call void @llvm.memcpy")
}

/// `f` compiled and interpreted on the same inputs (every byte of every buffer a pattern,
/// outputs too): the same bytes in every buffer after the call.
fn same_as_interpreter(f: &PrimFunc) {
    same_as_interpreter_with(f, &CodegenOptions::host());
}

/// [`same_as_interpreter`] for code built with `opts`.
fn same_as_interpreter_with(f: &PrimFunc, opts: &CodegenOptions) {
    let bufs: Vec<HostBuffer> = f
        .params
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let Param::Buffer(b) = p else {
                panic!("buffers only")
            };
            let shape: Vec<i64> = b.shape.iter().map(|e| e.as_int().unwrap()).collect();
            let mut h = HostBuffer::zeros(b.dtype, &shape);
            for (i, x) in h.data.iter_mut().enumerate() {
                // Small bytes: every float and integer pattern is an ordinary value.
                *x = ((i * 7 + k * 13) % 61) as u8;
            }
            h
        })
        .collect();
    let got = common::run_jit_with(f, &bufs, opts);
    let mut args: Vec<InterpArg> = bufs.into_iter().map(InterpArg::Buffer).collect();
    interp::run(f, &mut args).unwrap();
    for (k, (g, a)) in got.iter().zip(&args).enumerate() {
        assert_eq!(
            g,
            &a.buffer().unwrap().data,
            "{}: buffer {k} differs",
            f.name
        );
    }
}

fn c32(v: i64) -> Expr {
    int(DataType::i32(), v)
}

/// TVM's reshape of `X[2, 8, 16, 16]` into `T[4, 4, 256]` (its index form, int32 loops).
fn reshape(t: DataType, noalias: bool) -> PrimFunc {
    let x = Buffer::new("X", t, vec![c32(2), c32(8), c32(16), c32(16)]);
    let y = Buffer::new("T", t, vec![c32(4), c32(4), c32(256)]);
    let body = for_range("a", c32(4), ForKind::Serial, |a| {
        for_range("b", c32(4), ForKind::Serial, |b| {
            for_range("c", c32(256), ForKind::Serial, |c| {
                y.store(
                    vec![a.clone(), b.clone(), c.clone()],
                    x.load(vec![
                        a.clone().floordiv(c32(2)),
                        a.clone().floormod(c32(2)) * c32(4) + b.clone(),
                        c.clone().floordiv(c32(16)),
                        c.clone().floormod(c32(16)),
                    ]),
                )
            })
        })
    });
    PrimFunc::new("reshape", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(noalias)
}

/// `T[i, j] = X[i, j + skip]` over `rows x cols` of `X[rows, cols + skip]`.
fn rows(rows: i64, cols: i64, skip: i64, t: DataType) -> PrimFunc {
    let x = Buffer::new("X", t, vec![Expr::from(rows), Expr::from(cols + skip)]);
    let y = Buffer::new("T", t, vec![Expr::from(rows), Expr::from(cols)]);
    let body = for_range("i", Expr::from(rows), ForKind::Serial, |i| {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            y.store(
                vec![i.clone(), j.clone()],
                x.load(vec![i.clone(), j + Expr::from(skip)]),
            )
        })
    });
    PrimFunc::new("rows", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true)
}

/// `T[j, i] = X[i, j]`.
fn transpose(n: i64) -> PrimFunc {
    let t = DataType::f32();
    let x = Buffer::new("X", t, vec![Expr::from(n), Expr::from(n)]);
    let y = Buffer::new("T", t, vec![Expr::from(n), Expr::from(n)]);
    let body = for_range("i", Expr::from(n), ForKind::Serial, |i| {
        for_range("j", Expr::from(n), ForKind::Serial, |j| {
            y.store(vec![j.clone(), i.clone()], x.load(vec![i, j]))
        })
    });
    PrimFunc::new("transpose", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true)
}

#[test]
fn a_reshape_is_one_memcpy_for_every_element_type() {
    for t in [
        DataType::f32(),
        DataType::f64(),
        DataType::i8(),
        DataType::i64(),
        DataType::f16(),
    ] {
        let f = reshape(t, true);
        assert_eq!(memcpys(&f), 1, "{t:?}");
        same_as_interpreter(&f);
    }
}

#[test]
fn rows_of_a_wider_buffer_are_one_memcpy_each() {
    // 512 floats a row (2 KiB), 8 apart: the row loop stays, each row one call at its own
    // offset (the outer variable in the address).
    let f = rows(3, 512, 8, DataType::f32());
    let n = memcpys(&f);
    assert!((1..=3).contains(&n), "{n}");
    same_as_interpreter(&f);
    // No gap: the whole nest is one region.
    let f = rows(3, 512, 0, DataType::f32());
    assert_eq!(memcpys(&f), 1);
    same_as_interpreter(&f);
}

#[test]
fn nests_outside_the_rule_stay_loops() {
    // Strided (a transpose), small (255 floats: under 1 KiB), and without `noalias` (the
    // buffers may overlap, where a forward loop and `memcpy` differ).
    for f in [
        transpose(64),
        rows(1, 255, 0, DataType::f32()),
        reshape(DataType::f32(), false),
    ] {
        assert_eq!(memcpys(&f), 0, "{}", f.name);
        same_as_interpreter(&f);
    }
    // A copy with a conversion is not a copy.
    let t = DataType::f32();
    let x = Buffer::new("X", DataType::i32(), vec![Expr::from(1024i64)]);
    let y = Buffer::new("T", t, vec![Expr::from(1024i64)]);
    let body: Stmt = for_range("i", Expr::from(1024i64), ForKind::Serial, |i| {
        y.store(
            vec![i.clone()],
            Expr::Cast {
                dtype: t,
                value: Box::new(x.load(vec![i])),
                saturate: true,
            },
        )
    });
    let f =
        PrimFunc::new("cast", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true);
    assert_eq!(memcpys(&f), 0);
    same_as_interpreter(&f);
}

/// A copy whose destination index reads the destination (`T[I[0] + j] = X[j]` with `I` the
/// destination itself): a loop reads the index again after each store, a `memcpy` would read it
/// once, so it stays a loop.
#[test]
fn an_index_that_loads_stays_a_loop() {
    let t = DataType::i32();
    let x = Buffer::new("X", t, vec![Expr::from(512i64)]);
    let y = Buffer::new("T", t, vec![Expr::from(1024i64)]);
    let body = for_range("j", Expr::from(512i64), ForKind::Serial, |j| {
        y.store(
            vec![y.load(vec![Expr::from(0i64)]).cast(DataType::i64()) + j.clone()],
            x.load(vec![j]),
        )
    });
    let f = PrimFunc::new("self_index", vec![Param::Buffer(x), Param::Buffer(y)], body)
        .with_noalias(true);
    assert_eq!(memcpys(&f), 0);
}

/// The number of 8-lane shuffles in `f`'s optimized LLVM IR for the host: at least 16 in a
/// transposing nest emitted in 8 x 8 tiles (`codegen/llvm/emit/transpose.rs`), in either form.
fn tile_shuffles(f: &PrimFunc) -> usize {
    lines_with(f, "shufflevector <8 x ") + lines_with(f, "shufflevector <16 x ")
}

/// Code generation options for an x86 CPU by its LLVM name.
fn cpu_opts(cpu: &str) -> CodegenOptions {
    common::target_opts(&format!(r#"{{"kind": "llvm", "mcpu": "{cpu}"}}"#))
}

/// `f`'s x86 assembly for CPU `cpu`.
fn asm_for(f: &PrimFunc, cpu: &str) -> String {
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f.clone()]), &cpu_opts(cpu)).unwrap();
    m.get_source("asm").unwrap()
}

/// How many lines of `asm` hold an instruction whose name starts with `op`.
fn count_op(asm: &str, op: &str) -> usize {
    asm.lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.starts_with(op))
        })
        .count()
}

/// `T[i, j] = X[j, i]` for `X[cols, rows]` of element type `t`, with `i` inside (`inner_i`)
/// or outside `j`.
fn transpose_rect(rows: i64, cols: i64, t: DataType, inner_i: bool) -> PrimFunc {
    let x = Buffer::new("X", t, vec![Expr::from(cols), Expr::from(rows)]);
    let y = Buffer::new("T", t, vec![Expr::from(rows), Expr::from(cols)]);
    let store = |i: Expr, j: Expr| y.store(vec![i.clone(), j.clone()], x.load(vec![j, i]));
    let body = if inner_i {
        for_range("j", Expr::from(cols), ForKind::Serial, |j| {
            for_range("i", Expr::from(rows), ForKind::Serial, |i| {
                store(i, j.clone())
            })
        })
    } else {
        for_range("i", Expr::from(rows), ForKind::Serial, |i| {
            for_range("j", Expr::from(cols), ForKind::Serial, |j| {
                store(i.clone(), j)
            })
        })
    };
    PrimFunc::new(
        "transpose_rect",
        vec![Param::Buffer(x), Param::Buffer(y)],
        body,
    )
    .with_noalias(true)
}

/// TOPI's NCHW -> NHWC transpose of `X[n, c, h, w]` (int32 loops, `c` innermost).
fn nchw_to_nhwc(n: i64, c: i64, h: i64, w: i64, t: DataType) -> PrimFunc {
    let x = Buffer::new("X", t, vec![c32(n), c32(c), c32(h), c32(w)]);
    let y = Buffer::new("T", t, vec![c32(n), c32(h), c32(w), c32(c)]);
    let body = for_range("n", c32(n), ForKind::Serial, |a| {
        for_range("h", c32(h), ForKind::Serial, |b| {
            for_range("w", c32(w), ForKind::Serial, |d| {
                for_range("c", c32(c), ForKind::Serial, |e| {
                    y.store(
                        vec![a.clone(), b.clone(), d.clone(), e.clone()],
                        x.load(vec![a.clone(), e, b.clone(), d.clone()]),
                    )
                })
            })
        })
    });
    PrimFunc::new(
        "nchw_to_nhwc",
        vec![Param::Buffer(x), Param::Buffer(y)],
        body,
    )
    .with_noalias(true)
}

/// Transposes whose two inner extents are at least 8 are emitted as 8 x 8 register tiles (and
/// plain loops for the rows and columns past the last whole tile), in either loop order, for
/// 32-bit floats and integers, with loops outside them; each gives the interpreter's bytes.
#[test]
fn transposes_are_tiled_in_registers() {
    for (f, tiles) in [
        (transpose(64), 1),
        (transpose_rect(8, 8, DataType::f32(), false), 1),
        (transpose_rect(24, 16, DataType::i32(), false), 1),
        (transpose_rect(16, 40, DataType::u32(), true), 1),
        (nchw_to_nhwc(2, 8, 16, 16, DataType::f32()), 1),
        (nchw_to_nhwc(1, 16, 3, 8, DataType::i32()), 1),
        // Extents that are not multiples of 8: whole tiles, then strips of the rest.
        (transpose_rect(12, 16, DataType::f32(), false), 1),
        (transpose_rect(16, 20, DataType::f32(), true), 1),
        (transpose_rect(20, 24, DataType::f32(), false), 1),
        (transpose_rect(9, 9, DataType::i32(), true), 1),
        (nchw_to_nhwc(2, 12, 3, 10, DataType::f32()), 1),
    ] {
        let shuffles = tile_shuffles(&f);
        assert!(
            shuffles >= 16 * tiles,
            "{}: {shuffles} shuffles, want a tile's 16\n{f}",
            f.name
        );
        same_as_interpreter(&f);
        if cfg!(target_arch = "x86_64") {
            // 256-bit registers: rows joined by loads into 128-bit halves, 16 in-lane
            // shuffles, no lane-crossing one.
            let asm = asm_for(&f, "haswell");
            let (joins, crossing) = (count_op(&asm, "vinsertf128"), count_op(&asm, "vperm2f128"));
            assert!(
                joins >= 8 * tiles && crossing == 0,
                "{}, haswell: {joins} vinsertf128 and {crossing} vperm2f128\n{asm}",
                f.name
            );
            // 512-bit registers: two-source permutes (`vpermt2ps`, `vpermi2d`, ...), 8 a tile.
            let asm = asm_for(&f, "skylake-avx512");
            let permutes = count_op(&asm, "vpermt2") + count_op(&asm, "vpermi2");
            assert!(
                permutes >= 8 * tiles,
                "{}, skylake-avx512: {permutes} vpermt2\n{asm}",
                f.name
            );
            for (cpu, has) in [
                ("haswell", std::arch::is_x86_feature_detected!("avx2")),
                (
                    "skylake-avx512",
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512dq")
                        && std::arch::is_x86_feature_detected!("avx512vl"),
                ),
            ] {
                if has {
                    same_as_interpreter_with(&f, &cpu_opts(cpu));
                }
            }
        }
    }
}

/// Transposes outside the tiles' rule (an extent not a multiple of 8, 64-bit or 16-bit
/// elements, buffers that may overlap) are emitted as written, with the interpreter's results.
#[test]
fn transposes_outside_the_tile_rule_stay_loops() {
    let aliased = {
        let f = transpose_rect(16, 16, DataType::f32(), false);
        f.with_noalias(false)
    };
    for f in [
        transpose_rect(7, 16, DataType::f32(), false),
        transpose_rect(16, 5, DataType::f32(), true),
        transpose_rect(16, 16, DataType::f64(), false),
        transpose_rect(16, 16, DataType::f16(), false),
        nchw_to_nhwc(2, 3, 8, 8, DataType::f32()),
        aliased,
    ] {
        let shuffles = tile_shuffles(&f);
        assert!(shuffles < 16, "{}: {shuffles} shuffles\n{f}", f.name);
        same_as_interpreter(&f);
    }
}
