//! Streaming (non-temporal) stores: outputs written once and larger than the threshold get
//! `vmovntps` on x86, nothing else does, and the streaming form of a loop computes exactly what
//! the ordinary loop computes, for every alignment of the output.

mod common;

use common::target_opts;
use kiln::codegen::llvm::{stream, CodegenOptions, LlvmModule};
use kiln::ir::builder::for_range;
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{kernels, Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, Var};
use kiln::packed_func::ffi::{DLDataTypeCode, DLDeviceType};
use kiln::packed_func::{AnyView, DLDataType, DLDevice, DLTensor, Module};

fn x86_host() -> bool {
    cfg!(target_arch = "x86_64")
}

fn opts(stream_store_bytes: Option<u64>) -> CodegenOptions {
    CodegenOptions {
        stream_store_bytes,
        ..CodegenOptions::host()
    }
}

fn asm(f: PrimFunc, o: &CodegenOptions) -> String {
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), o).unwrap();
    m.wait_optimized().unwrap();
    m.get_source("asm").unwrap()
}

/// `C[i, j] = A[i, j] * 0.5 + B[j]` over rows in parallel, columns serial, `C` written from
/// column `skip` on (the first columns keep what they held).
fn rows(rows: i64, cols: i64, skip: i64, t: DataType) -> PrimFunc {
    let a = Buffer::new("A", t, vec![Expr::from(rows), Expr::from(cols)]);
    let b = Buffer::new("B", t, vec![Expr::from(cols)]);
    let c = Buffer::new("C", t, vec![Expr::from(rows), Expr::from(cols)]);
    let j = Var::new("j", DataType::i64());
    let body = for_range("i", Expr::from(rows), ForKind::Parallel, |i| Stmt::For {
        var: j.clone(),
        min: Expr::from(skip),
        extent: Expr::from(cols - skip),
        kind: ForKind::Serial,
        body: Box::new(c.store(
            vec![i.clone(), Expr::Var(j.clone())],
            a.load(vec![i, Expr::Var(j.clone())]) * kiln::ir::builder::constant(t, 0.5)
                + b.load(vec![Expr::Var(j.clone())]),
        )),
    });
    PrimFunc::new(
        "rows",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// Host memory for one tensor whose data starts `shift` bytes after a 64-byte boundary.
struct Shifted {
    store: Vec<u64>,
    shift: usize,
    shape: Vec<i64>,
    nbytes: usize,
    dtype: DataType,
}

impl Shifted {
    fn new(h: &HostBuffer, shift: usize) -> Shifted {
        let nbytes = h.data.len();
        let mut store = vec![0u64; (nbytes + 128) / 8 + 1];
        let base = store.as_ptr() as usize;
        let start = base.next_multiple_of(64) - base + shift;
        // SAFETY: `store` holds `start + nbytes` bytes (start < 128).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(store.as_mut_ptr().cast::<u8>(), nbytes + 128)
        };
        bytes[start..start + nbytes].copy_from_slice(&h.data);
        Shifted {
            shift: start,
            store,
            shape: h.shape.clone(),
            nbytes,
            dtype: h.dtype,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: as in `new`.
        let b = unsafe {
            std::slice::from_raw_parts(self.store.as_ptr().cast::<u8>(), self.nbytes + 128)
        };
        b[self.shift..self.shift + self.nbytes].to_vec()
    }

    fn dl(&mut self) -> DLTensor {
        DLTensor {
            // SAFETY: within `store` (see `new`).
            data: unsafe { self.store.as_mut_ptr().cast::<u8>().add(self.shift) }.cast(),
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            ndim: self.shape.len() as i32,
            dtype: DLDataType {
                code: DLDataTypeCode(self.dtype.code as u8),
                bits: self.dtype.bits,
                lanes: 1,
            },
            shape: self.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

fn values(t: DataType, shape: &[i64], seed: i64) -> HostBuffer {
    let n: i64 = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|k| ((k * 7 + seed * 13) % 23) as f64 * 0.37 - 3.0)
        .collect();
    if t == DataType::f64() {
        HostBuffer::from_slice(shape, &v)
    } else {
        let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
        HostBuffer::from_slice(shape, &v)
    }
}

/// Runs `f` compiled with `o` on inputs whose data starts `shift` bytes past a 64-byte
/// boundary; returns the last buffer's bytes, and the interpreter's.
fn run_both(f: &PrimFunc, o: &CodegenOptions, shift: usize) -> (Vec<u8>, Vec<u8>) {
    let bufs: Vec<HostBuffer> = f
        .params
        .iter()
        .enumerate()
        .map(|(k, p)| match p {
            Param::Buffer(b) => {
                let shape: Vec<i64> = b.shape.iter().map(|d| d.as_int().unwrap()).collect();
                values(b.dtype, &shape, k as i64)
            }
            Param::Scalar(_) => unreachable!(),
        })
        .collect();
    let mut iargs: Vec<InterpArg> = bufs.iter().cloned().map(InterpArg::Buffer).collect();
    interp::run(f, &mut iargs).unwrap();
    let InterpArg::Buffer(want) = iargs.last().unwrap() else {
        unreachable!()
    };
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f.clone()]), o).unwrap();
    m.wait_optimized().unwrap();
    let mut arrays: Vec<Shifted> = bufs.iter().map(|h| Shifted::new(h, shift)).collect();
    let dls: Vec<DLTensor> = arrays.iter_mut().map(Shifted::dl).collect();
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    m.require_function(&f.name).unwrap().call(&views).unwrap();
    (arrays.last().unwrap().bytes(), want.data.clone())
}

#[test]
fn big_outputs_get_non_temporal_stores_on_x86() {
    if !x86_host() {
        return;
    }
    // vadd's size is symbolic: the streaming loop is there, behind a run-time size check.
    let a = asm(kernels::vadd(), &CodegenOptions::host());
    assert!(a.contains("vmovntps") || a.contains("movntps"), "{a}");
    assert!(a.contains("sfence"), "{a}");
    // A constant size below the threshold: ordinary stores only.
    let small = asm(rows(1, 1024, 0, DataType::f32()), &CodegenOptions::host());
    assert!(!small.contains("movnt"), "{small}");
    // No threshold: none either.
    let off = asm(kernels::vadd(), &opts(None));
    assert!(!off.contains("movnt"), "{off}");
    // Outputs that are read back (softmax) or updated (matmul's C) never stream.
    let sm = asm(
        kiln::schedule::kernels::softmax_sized(64, 4096).unwrap(),
        &opts(Some(0)),
    );
    assert!(!sm.contains("movnt"), "softmax streams");
    let mm = asm(kernels::matmul_sized(64, 64, 64), &opts(Some(0)));
    assert!(!mm.contains("movnt"), "matmul streams");
    // A register-tiled matmul writes `C` once, from its tiles' caches, in rows of a tile's
    // width (24 or 32 floats): too narrow to stream, though `C` (36 KiB) is past the threshold.
    let tiled = asm(
        kiln::schedule::kernels::matmul_sized(96, 96, 64).unwrap(),
        &opts(Some(16 << 10)),
    );
    assert!(
        !tiled.contains("movnt"),
        "a tiled matmul's narrow rows stream"
    );
}

#[test]
fn an_avx2_target_streams_from_ymm_registers() {
    if !x86_host() {
        return;
    }
    let o = target_opts(r#"{"kind": "llvm", "mcpu": "haswell"}"#);
    // The host's last-level cache, whatever CPU the target names, at most the maximum.
    let want = kiln::target::host_caches()
        .last_level
        .map_or(stream::STREAM_STORE_MAX_BYTES, |l| {
            l.min(stream::STREAM_STORE_MAX_BYTES)
        });
    assert_eq!(o.stream_store_bytes, Some(want));
    let a = asm(kernels::vadd(), &o);
    let nt: Vec<&str> = a.lines().filter(|l| l.contains("movnt")).collect();
    assert!(!nt.is_empty(), "{a}");
    assert!(nt.iter().all(|l| l.contains("ymm")), "{nt:?}");
    assert!(!a.contains("zmm"), "AVX-512 register in haswell code");
}

#[test]
fn targets_off_x86_never_stream() {
    let o = target_opts(r#"{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}"#);
    assert_eq!(o.stream_store_bytes, None);
    let native = target_opts(r#"{"kind": "llvm", "mcpu": "native"}"#);
    if x86_host() {
        let t = native.stream_store_bytes.unwrap();
        assert!(t > 0 && t <= stream::STREAM_STORE_MAX_BYTES, "{t}");
    }
}

#[test]
fn streamed_loops_compute_what_plain_loops_compute_at_every_alignment() {
    for t in [DataType::f32(), DataType::f64()] {
        for (r, c, skip) in [
            (3, 37, 0),
            (4, 100, 3),
            (2, 1, 0),
            (5, 16, 0),
            (2, 200, 17),
            (2, 131, 0),
        ] {
            let f = rows(r, c, skip, t);
            for shift in [0, 4, 8, 12, 24, 40, 60] {
                if t == DataType::f64() && shift % 8 != 0 {
                    continue;
                }
                let (got, want) = run_both(&f, &opts(Some(0)), shift);
                assert_eq!(
                    got, want,
                    "{t} {r}x{c} from column {skip}, data at +{shift} bytes"
                );
                let (plain, _) = run_both(&f, &opts(None), shift);
                assert_eq!(plain, want);
            }
        }
    }
    // An output not aligned to its element: every iteration scalar, still right.
    let f = rows(3, 50, 0, DataType::f32());
    let (got, want) = run_both(&f, &opts(Some(0)), 2);
    assert_eq!(got, want);
}

/// Under the default threshold, rows of fewer than 512 bytes of constant length are left to
/// LLVM (they would run mostly in the scalar head and tail); wider rows of a big output stream.
#[test]
fn narrow_rows_of_constant_length_are_not_streamed() {
    if !x86_host() {
        return;
    }
    let o = opts(Some(1 << 20));
    // 4096 rows of 127 floats (508 bytes), 2 MiB in all: ordinary stores.
    let narrow = asm(rows(4096, 127, 0, DataType::f32()), &o);
    assert!(!narrow.contains("movnt"), "narrow rows streamed");
    // 4096 rows of 128 floats: streamed.
    let wide = asm(rows(4096, 128, 0, DataType::f32()), &o);
    assert!(wide.contains("movnt"), "wide rows not streamed");
}

#[test]
fn symbolic_sizes_choose_at_run_time() {
    // vadd with a 4 KiB threshold: 100 elements run the ordinary loop, 5000 the streaming one;
    // both exact.
    let f = kernels::vadd();
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f]), &opts(Some(4096))).unwrap();
    m.wait_optimized().unwrap();
    let asm = m.get_source("asm").unwrap();
    if x86_host() {
        assert!(asm.contains("movnt"));
    }
    let pf = m.require_function("vadd").unwrap();
    for n in [0i64, 1, 100, 1023, 1024, 5000, 5001] {
        let hv = |seed| values(DataType::f32(), &[n], seed);
        let mut arrays: Vec<Shifted> = [hv(1), hv(2), HostBuffer::zeros(DataType::f32(), &[n])]
            .iter()
            .map(|h| Shifted::new(h, 4))
            .collect();
        let dls: Vec<DLTensor> = arrays.iter_mut().map(Shifted::dl).collect();
        let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
        pf.call(&views).unwrap();
        let get = |b: Vec<u8>| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (a, b, c) = (
            get(arrays[0].bytes()),
            get(arrays[1].bytes()),
            get(arrays[2].bytes()),
        );
        for k in 0..n as usize {
            assert_eq!(c[k], a[k] + b[k], "n = {n}, element {k}");
        }
    }
}

/// A loop that also writes another buffer keeps its ordinary form: computing its iterations 16
/// at a time could read what a later iteration wrote (`D[i] = A[i]; C[i] = D[i + 1]` reads the
/// old `D[i + 1]` in order).
#[test]
fn loops_with_another_store_are_not_streamed() {
    let t = DataType::f32();
    let n = 100i64;
    let a = Buffer::new("A", t, vec![Expr::from(n)]);
    let d = Buffer::new("D", t, vec![Expr::from(n + 1)]);
    let c = Buffer::new("C", t, vec![Expr::from(n)]);
    let body = for_range("i", Expr::from(n), ForKind::Serial, |i| {
        Stmt::Seq(vec![
            d.store(vec![i.clone()], a.load(vec![i.clone()])),
            c.store(vec![i.clone()], d.load(vec![i + Expr::from(1i64)])),
        ])
    });
    let f = PrimFunc::new(
        "two",
        vec![Param::Buffer(a), Param::Buffer(d), Param::Buffer(c)],
        body,
    )
    .with_noalias(true);
    if x86_host() {
        let a = asm(f.clone(), &opts(Some(0)));
        assert!(!a.contains("movnt"), "a loop with two stores streams");
    }
    let (got, want) = run_both(&f, &opts(Some(0)), 4);
    assert_eq!(got, want);
}

/// A store whose index uses a variable bound inside the loop body still compiles and computes
/// what the loop computes (its address cannot be taken before the loop, so it is not streamed).
#[test]
fn stores_indexed_by_variables_of_the_body_keep_the_ordinary_form() {
    let t = DataType::f32();
    let n = 100i64;
    let a = Buffer::new("A", t, vec![Expr::from(n)]);
    let c = Buffer::new("C", t, vec![Expr::from(n + 3)]);
    let body = for_range("i", Expr::from(n), ForKind::Serial, |i| {
        kiln::ir::builder::let_stmt("off", Expr::from(3i64), |off| {
            c.store(vec![i.clone() + off], a.load(vec![i]) * 2.0f32)
        })
    });
    let f =
        PrimFunc::new("letoff", vec![Param::Buffer(a), Param::Buffer(c)], body).with_noalias(true);
    let (got, want) = run_both(&f, &opts(Some(0)), 4);
    assert_eq!(got, want);
}

/// The write-back of a `cache_write` (a vectorized copy of the row's cache into the output)
/// streams when it is the output's only store: a softmax whose row is staged writes its output
/// once, without reading its lines first, and computes what the plain softmax computes.
#[test]
fn a_staged_rows_write_back_streams() {
    let plain = kernels::softmax_sized(6, 256);
    let mut s = kiln::schedule::Schedule::new(plain.clone());
    s.cache_write("B", "i").unwrap();
    s.parallel("i").unwrap();
    let f = s.finish().unwrap();
    if x86_host() {
        let a = asm(f.clone(), &opts(Some(0)));
        assert!(a.contains("movnt"), "the write-back does not stream\n{f}");
    }
    let floats = |b: &[u8]| -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    for shift in [0, 4, 36] {
        let (got, want) = run_both(&f, &opts(Some(0)), shift);
        let (plain_got, plain_want) = run_both(&plain, &opts(None), shift);
        assert_eq!(
            want, plain_want,
            "the staged softmax and the plain one differ in the interpreter"
        );
        for (k, (x, y)) in floats(&got).iter().zip(&floats(&plain_got)).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs().max(1e-3),
                "[{k}] at +{shift}: {x} vs {y}"
            );
        }
    }
}
