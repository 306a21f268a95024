//! Indices read from memory are checked in generated CPU code: a gather, a scatter or an
//! embedding whose index data is out of bounds raises an `IndexError` naming the function, the
//! buffer and the axis, instead of reading or writing outside the buffer (TVM's code, and
//! kiln's before, read or wrote there: a crash, or silent corruption). The checks cover the
//! scalar accesses, each lane of a gathered vector, and both ends of a contiguous vector access
//! whose start comes from memory. Indices computed from the loops alone are not checked.

mod common;

use common::HostArray;
use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::IRModule;
use kiln::packed_func::ffi::DLDataTypeCode;
use kiln::packed_func::{AnyView, DLDataType, Module, PackedFunc};

fn i32s(shape: &[i64], values: &[i32]) -> HostArray {
    let t = DLDataType {
        code: DLDataTypeCode::INT,
        bits: 32,
        lanes: 1,
    };
    let mut a = HostArray::zeros(shape, t, 4);
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    a.bytes_mut().copy_from_slice(&bytes);
    a
}

fn int(v: i64) -> String {
    format!(r#"{{"const": {v}, "dtype": "int32"}}"#)
}

fn var(n: &str) -> String {
    format!(r#"{{"var": "{n}"}}"#)
}

fn load(buf: &str, idx: Vec<String>) -> String {
    format!(
        r#"{{"op": "load", "buffer": "{buf}", "indices": [{}]}}"#,
        idx.join(", ")
    )
}

fn store(buf: &str, idx: Vec<String>, value: &str) -> String {
    format!(
        r#"{{"stmt": "store", "buffer": "{buf}", "indices": [{}], "value": {value}}}"#,
        idx.join(", ")
    )
}

fn for_(v: &str, extent: i64, kind: &str, body: &str) -> String {
    format!(
        r#"{{"stmt": "for", "var": {{"name": "{v}", "dtype": "int32"}}, "min": {}, "extent": {}, "kind": "{kind}", "body": {body}}}"#,
        int(0),
        int(extent)
    )
}

fn buffer(name: &str, dtype: &str, shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(|&d| int(d)).collect();
    format!(
        r#"{{"kind": "buffer", "name": "{name}", "dtype": "{dtype}", "shape": [{}]}}"#,
        dims.join(", ")
    )
}

fn func(name: &str, params: &[String], body: &str) -> String {
    format!(
        r#"{{"name": "{name}", "params": [{}], "attrs": {{"global_symbol": "{name}", "noalias": true}}, "body": {body}}}"#,
        params.join(", ")
    )
}

/// `name`: `out[i] = A[idx[i]]` for `i` in 0..6, serial, `A` declared by `table`.
fn gather_fn(name: &str, table: &str) -> String {
    let i = var("i");
    func(
        name,
        &[
            table.to_string(),
            buffer("idx", "int32", &[6]),
            buffer("out", "float32", &[6]),
        ],
        &for_(
            "i",
            6,
            "serial",
            &store(
                "out",
                vec![i.clone()],
                &load("A", vec![load("idx", vec![i])]),
            ),
        ),
    )
}

/// Five functions whose indices come from memory:
/// - `embed`: `out[i, j] = W[ids[i], j]`, rows in parallel, `j` a vector of 16;
/// - `gather`: `out[i] = A[idx[i]]`, serial;
/// - `scatter`: `out[idx[i]] = v[i]`, serial;
/// - `shifted`: `out[j] = A[off[0] + j]`, `j` a vector of 8 (a contiguous access whose start
///   comes from memory: its last lane must be in bounds too);
/// - `gather_n`: `gather` from `A` of symbolic length `n`.
fn module() -> LlvmModule {
    let (i, j) = (var("i"), var("j"));
    let embed = func(
        "embed",
        &[
            buffer("W", "float32", &[5, 16]),
            buffer("ids", "int32", &[4]),
            buffer("out", "float32", &[4, 16]),
        ],
        &for_(
            "i",
            4,
            "parallel",
            &for_(
                "j",
                16,
                "vectorized",
                &store(
                    "out",
                    vec![i.clone(), j.clone()],
                    &load("W", vec![load("ids", vec![i.clone()]), j.clone()]),
                ),
            ),
        ),
    );
    let gather = gather_fn("gather", &buffer("A", "float32", &[10]));
    let scatter = func(
        "scatter",
        &[
            buffer("out", "float32", &[10]),
            buffer("idx", "int32", &[6]),
            buffer("v", "float32", &[6]),
        ],
        &for_(
            "i",
            6,
            "serial",
            &store(
                "out",
                vec![load("idx", vec![i.clone()])],
                &load("v", vec![i.clone()]),
            ),
        ),
    );
    let start = format!(
        r#"{{"op": "add", "args": [{}, {j}]}}"#,
        load("off", vec![int(0)])
    );
    let shifted = func(
        "shifted",
        &[
            buffer("A", "float32", &[20]),
            buffer("off", "int32", &[1]),
            buffer("out", "float32", &[8]),
        ],
        &for_(
            "j",
            8,
            "vectorized",
            &store("out", vec![j.clone()], &load("A", vec![start])),
        ),
    );
    // `gather` from a table of symbolic length `n`.
    let table = r#"{"kind": "buffer", "name": "A", "dtype": "float32", "shape": [{"var": "n", "dtype": "int32"}]}"#;
    let gather_n = gather_fn("gather_n", table);
    let text = format!(
        r#"{{"format": "kiln-ir/1", "functions": [{embed}, {gather}, {scatter}, {shifted}, {gather_n}]}}"#
    );
    let m = IRModule::from_json_str(&text).unwrap();
    m.verify().unwrap();
    LlvmModule::jit(&m, &CodegenOptions::host()).unwrap()
}

fn call(f: &PackedFunc, arrays: &mut [&mut HostArray]) -> Result<(), String> {
    let dls: Vec<_> = arrays.iter_mut().map(|a| a.dl()).collect();
    let args: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    f.call(&args).map(|_| ()).map_err(|e| e.to_string())
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|x| x as f32).collect()
}

#[test]
fn an_embedding_row_out_of_bounds_raises_an_index_error() {
    let m = module();
    let f = m.require_function("embed").unwrap();
    let mut w = HostArray::f32(&[5, 16], &iota(80));
    let mut out = HostArray::f32(&[4, 16], &[0.0; 64]);
    let mut ids = i32s(&[4], &[4, 0, 2, 4]);
    call(&f, &mut [&mut w, &mut ids, &mut out]).unwrap();
    let got = out.to_f32();
    for (r, id) in [4, 0, 2, 4].iter().enumerate() {
        assert_eq!(got[r * 16..r * 16 + 16], iota(80)[id * 16..id * 16 + 16]);
    }
    for bad in [5, -1, i32::MAX, i32::MIN] {
        let mut ids = i32s(&[4], &[0, 1, bad, 2]);
        let e = call(&f, &mut [&mut w, &mut ids, &mut out]).unwrap_err();
        assert_eq!(
            e,
            "IndexError: index out of bounds in `embed`: an index read from memory is outside \
             axis 0 of `W` (extent 5)",
            "row {bad}"
        );
    }
}

#[test]
fn a_gather_and_a_scatter_check_every_index() {
    let m = module();
    check_gather(&m, "gather", 10, "10");

    let s = m.require_function("scatter").unwrap();
    let mut out = HostArray::f32(&[10], &[0.0; 10]);
    let mut v = HostArray::f32(&[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let mut idx = i32s(&[6], &[9, 0, 3, 5, 8, 1]);
    call(&s, &mut [&mut out, &mut idx, &mut v]).unwrap();
    assert_eq!(
        out.to_f32(),
        [2.0, 6.0, 0.0, 3.0, 0.0, 4.0, 0.0, 0.0, 5.0, 1.0]
    );
    // The stores before the bad index happened; the one outside the buffer did not (the
    // slot past the array, which the test's allocation has, keeps its zero).
    let mut out = HostArray::f32(&[10], &[0.0; 10]);
    let mut idx = i32s(&[6], &[0, 1, 10, 2, 3, 4]);
    let e = call(&s, &mut [&mut out, &mut idx, &mut v]).unwrap_err();
    assert_eq!(
        e,
        "IndexError: index out of bounds in `scatter`: an index read from memory is outside \
         axis 0 of `out` (extent 10)"
    );
    assert_eq!(
        out.to_f32(),
        [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        out.data[out.data.len() - 1],
        0,
        "nothing written past the buffer"
    );
}

#[test]
fn a_vector_whose_start_comes_from_memory_is_checked_at_both_ends() {
    let m = module();
    let f = m.require_function("shifted").unwrap();
    let mut a = HostArray::f32(&[20], &iota(20));
    let mut out = HostArray::f32(&[8], &[0.0; 8]);
    for ok in [0, 5, 12] {
        let mut off = i32s(&[1], &[ok]);
        call(&f, &mut [&mut a, &mut off, &mut out]).unwrap();
        assert_eq!(out.to_f32(), iota(20)[ok as usize..ok as usize + 8]);
    }
    // 13: the first lane is in bounds, the last (20) is not.
    for bad in [13, 20, -1, -8] {
        let mut off = i32s(&[1], &[bad]);
        let e = call(&f, &mut [&mut a, &mut off, &mut out]).unwrap_err();
        assert_eq!(
            e,
            "IndexError: index out of bounds in `shifted`: an index read from memory is \
             outside axis 0 of `A` (extent 20)",
            "offset {bad}"
        );
    }
}

#[test]
fn a_symbolic_extent_is_checked_and_named() {
    check_gather(&module(), "gather_n", 7, "n");
}

/// `name` (a `gather_fn`) from a table of `len` elements: in bounds it gathers; an index of
/// `len`, -1 or 2^28 raises the `IndexError` naming the table's extent `extent`.
fn check_gather(m: &LlvmModule, name: &str, len: i32, extent: &str) {
    let f = m.require_function(name).unwrap();
    let table: Vec<f32> = (0..len).map(|x| x as f32).collect();
    let mut a = HostArray::f32(&[i64::from(len)], &table);
    let mut out = HostArray::f32(&[6], &[0.0; 6]);
    let good = [len - 1, 0, 3, 3, len - 2, 1];
    let mut idx = i32s(&[6], &good);
    call(&f, &mut [&mut a, &mut idx, &mut out]).unwrap();
    let want: Vec<f32> = good.iter().map(|&x| x as f32).collect();
    assert_eq!(out.to_f32(), want);
    for bad in [len, -1, 1 << 28] {
        let mut idx = i32s(&[6], &[0, 1, 2, 3, 4, bad]);
        let e = call(&f, &mut [&mut a, &mut idx, &mut out]).unwrap_err();
        assert_eq!(
            e,
            format!(
                "IndexError: index out of bounds in `{name}`: an index read from memory is \
                 outside axis 0 of `A` (extent {extent})"
            ),
            "index {bad}"
        );
    }
}
