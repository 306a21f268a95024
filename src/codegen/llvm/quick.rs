//! The quick tier's argument decoder: the packed-API checks of a JIT module's quick wrappers,
//! run by Rust instead of compiled into each wrapper.
//!
//! A quick wrapper lives only until the optimized tier replaces it (`tiering.rs`), yet its
//! checks (`packed.rs`, [`super::packed::Mode::Conjunction`]) were most of the quick tier's
//! machine code: about 300 lines of IR per function of three tensors, and a quarter to a half of
//! a cold build's code generation (a Relax LSTM cell's nine wrappers: 17 ms of LLVM's time
//! against 17-23 ms for its nine compute functions). With a [`QuickSig`] the wrapper is a call
//! of [`decode`] (through `jit::kiln_jit_quick_decode`), which checks the arguments and writes
//! what the compute function takes into an array of slots, a branch, and the call.
//!
//! Same acceptance as the compiled checks, by construction of the protocol rather than by
//! trust in this file: the decoder's verdict only picks the path. When it rejects, the
//! wrapper calls the module's checker (the lazily compiled one with TVM's messages), which
//! raises the error; should the checker find none, the arguments are decoded again in
//! `trusted` mode, without checks, from memory the checker has vouched for. So a decoder
//! stricter than the checker costs a slow call, never a wrong result; it is never more lenient:
//! every check of [`super::packed`]'s conjunction is here, in the same order, with the same
//! barriers (no field of a tensor read before its type index and handle passed, no shape read
//! before its `ndim`).
//!
//! Signatures it does not describe (device host code, a shape variable bound by a float or
//! handle parameter, a variable of a non-integer type) keep the compiled checks ([`QuickSig::new`]
//! returns `None`).
//!
//! Every `unsafe` of this file reads caller memory under the barriers above.

use std::collections::HashMap;

use crate::ir::{DataType, Expr, Param, PrimFunc, TypeCode, VarId};
use crate::packed_func::ffi::{DLTensor, TVMFFIAny};

/// A shape or stride entry: a constant, or a variable (index into [`QuickSig::vars`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dim {
    Const(i64),
    Var(usize),
}

/// A parameter as the decoder checks it.
#[derive(Clone, Debug)]
enum Kind {
    Tensor {
        ndim: i32,
        code: u8,
        bits: u8,
        lanes: u16,
        shape: Vec<Dim>,
        /// `None`: compact (NULL or row-major strides); else each stride's entry.
        strides: Option<Vec<Dim>>,
    },
    Bool,
    Int,
    Float,
    Handle,
}

/// A variable of the signature: where its value is, and how wide it is compared.
#[derive(Clone, Debug)]
struct VarInfo {
    /// The compared width: a variable is truncated to its type before it is compared, as the
    /// compiled checks do (`trunc i64 to iN`).
    bits: u32,
    /// Bound by this scalar parameter (its slot), else by its first shape or stride.
    scalar: Option<usize>,
    /// The slot holding its value when a shape or stride binds it.
    slot: usize,
}

/// Where a compute argument comes from, for the wrapper's IR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A tensor's data pointer (with its byte offset), `inttoptr` of the slot: the compute
    /// parameter `%buf<buf>`, a pointer to `dtype`.
    Data {
        slot: usize,
        buf: VarId,
        dtype: DataType,
    },
    /// A scalar parameter's payload (for a float, the value as a double), converted to the
    /// variable's type as the compiled wrapper converts it: the compute parameter `%var<var>`.
    Scalar {
        slot: usize,
        var: VarId,
        dtype: DataType,
    },
    /// A shape or stride extent (an `i64`), truncated to the variable's type: `%var<var>`.
    Extent {
        slot: usize,
        var: VarId,
        dtype: DataType,
    },
}

/// The decoder's description of one function's packed signature.
#[derive(Clone, Debug)]
pub(crate) struct QuickSig {
    params: Vec<Kind>,
    vars: Vec<VarInfo>,
    /// The scalar parameters that bind a variable: (parameter index, variable index).
    scalar_binds: Vec<(usize, usize)>,
    /// The device type every tensor must be on.
    device_type: i32,
    /// Slots: one per parameter, then one per variable bound by a shape or stride.
    pub(crate) slots: usize,
    /// The compute function's arguments in order: each tensor's data, then every bound
    /// variable by id (the order of [`super::packed`]'s decode).
    pub(crate) args: Vec<Source>,
}

/// The description of `f` in a module built with `device_host` for tensors on `device_type`,
/// as the code generator and the decoder's table both decide it: none for device host code
/// (its wrappers keep their compiled checks), CPU tensors for a host function of a device
/// module (`FuncAttrs::host`).
pub(crate) fn describe(f: &PrimFunc, device_host: bool, device_type: i32) -> Option<QuickSig> {
    if f.attrs.host && device_host {
        QuickSig::new(f, crate::packed_func::DLDeviceType::CPU.0)
    } else if device_host {
        None
    } else {
        QuickSig::new(f, device_type)
    }
}

fn int_var(v: &crate::ir::Var) -> bool {
    matches!(v.dtype.code, TypeCode::Int | TypeCode::UInt) && v.dtype.lanes == 1
}

impl QuickSig {
    /// The description of `f`'s signature for tensors on `device_type`, or `None` where the
    /// compiled checks stay (see the module docs).
    pub(crate) fn new(f: &PrimFunc, device_type: i32) -> Option<QuickSig> {
        let n = f.params.len();
        let mut vars: Vec<VarInfo> = Vec::new();
        let mut index: HashMap<VarId, usize> = HashMap::new();
        let mut types: HashMap<VarId, DataType> = HashMap::new();
        let mut scalar_binds = Vec::new();
        let mut next_slot = n;
        // Scalars bind first, as in the compiled checks.
        for (i, p) in f.params.iter().enumerate() {
            if let Param::Scalar(v) = p {
                if index.contains_key(&v.id) {
                    return None;
                }
                index.insert(v.id, vars.len());
                types.insert(v.id, v.dtype);
                scalar_binds.push((i, vars.len()));
                vars.push(VarInfo {
                    bits: u32::from(v.dtype.bits),
                    scalar: Some(i),
                    slot: i,
                });
            }
        }
        let mut dim = |e: &Expr,
                       vars: &mut Vec<VarInfo>,
                       index: &mut HashMap<VarId, usize>,
                       types: &mut HashMap<VarId, DataType>|
         -> Option<Dim> {
            match e {
                Expr::IntImm { value, .. } => Some(Dim::Const(*value)),
                Expr::Var(v) if int_var(v) => {
                    // (A variable bound by a scalar is that scalar's: an integer, as `v` is.)
                    if let Some(&k) = index.get(&v.id) {
                        return Some(Dim::Var(k));
                    }
                    index.insert(v.id, vars.len());
                    types.insert(v.id, v.dtype);
                    vars.push(VarInfo {
                        bits: u32::from(v.dtype.bits),
                        scalar: None,
                        slot: next_slot,
                    });
                    next_slot += 1;
                    Some(Dim::Var(vars.len() - 1))
                }
                _ => None,
            }
        };
        let mut params = Vec::with_capacity(n);
        let mut args = Vec::new();
        for (i, p) in f.params.iter().enumerate() {
            params.push(match p {
                Param::Buffer(b) => {
                    let mut shape = Vec::with_capacity(b.shape.len());
                    for e in &b.shape {
                        shape.push(dim(e, &mut vars, &mut index, &mut types)?);
                    }
                    let strides = match &b.strides {
                        None => None,
                        Some(s) => {
                            let mut out = Vec::with_capacity(s.len());
                            for e in s {
                                out.push(dim(e, &mut vars, &mut index, &mut types)?);
                            }
                            Some(out)
                        }
                    };
                    args.push(Source::Data {
                        slot: i,
                        buf: b.data.id,
                        dtype: b.dtype,
                    });
                    Kind::Tensor {
                        ndim: i32::try_from(b.ndim()).ok()?,
                        code: b.dtype.code as u8,
                        bits: b.dtype.bits,
                        lanes: b.dtype.lanes,
                        shape,
                        strides,
                    }
                }
                Param::Scalar(v) => match v.dtype.code {
                    TypeCode::Bool => Kind::Bool,
                    TypeCode::Int | TypeCode::UInt => Kind::Int,
                    TypeCode::Float | TypeCode::BFloat => Kind::Float,
                    TypeCode::Handle => Kind::Handle,
                },
            });
        }
        // Every bound variable, by id.
        let mut ids: Vec<VarId> = index.keys().copied().collect();
        ids.sort();
        for id in ids {
            let info = &vars[index[&id]];
            let dtype = types[&id];
            args.push(match info.scalar {
                Some(slot) => Source::Scalar {
                    slot,
                    var: id,
                    dtype,
                },
                None => Source::Extent {
                    slot: info.slot,
                    var: id,
                    dtype,
                },
            });
        }
        Some(QuickSig {
            params,
            vars,
            scalar_binds,
            device_type,
            slots: next_slot.max(1),
            args,
        })
    }
}

/// `x` truncated to its low `bits` bits (64: unchanged).
fn low(x: i64, bits: u32) -> u64 {
    if bits >= 64 {
        x as u64
    } else {
        (x as u64) & ((1u64 << bits) - 1)
    }
}

/// Checks and decodes `num_args` arguments at `args` for `sig` into `slots` (`sig.slots`
/// of them). Returns whether every check passed; with `trusted` (the checker passed them) the
/// slots are written without checks.
///
/// # Safety
/// `args` points to `num_args` readable `TVMFFIAny` (or is anything when the count is wrong:
/// it is then not read), `slots` to `sig.slots` writable `u64`; a tensor argument's handle,
/// once its type index passed, points to a readable `DLTensor` (after the 24-byte object
/// header for a Tensor object) whose `shape` holds `ndim` extents and whose `strides`, when
/// not NULL, as many strides: the packed API's contract, which the compiled checks rely on too.
pub(crate) unsafe fn decode(
    sig: &QuickSig,
    args: *const TVMFFIAny,
    num_args: i32,
    slots: *mut u64,
    trusted: bool,
) -> bool {
    let n = sig.params.len();
    // 1. The count (a barrier: nothing is read before it).
    if !trusted && (usize::try_from(num_args).ok() != Some(n) || (n > 0 && args.is_null())) {
        return false;
    }
    // The tensor behind argument `i` (whose type index is 70 or 7).
    let tensor = |i: usize| -> *const DLTensor {
        // SAFETY: `i < num_args` (checked above, or vouched for by the checker).
        let a = unsafe { &*args.add(i) };
        // SAFETY: every payload is 8 bytes; reading it as an integer reads them as they are.
        let raw = unsafe { a.value.v_int64 };
        let off = if a.type_index.0 == 70 { 24 } else { 0 };
        raw.wrapping_add(off) as usize as *const DLTensor
    };
    // 2. Type indices and handles.
    let mut ok = true;
    for (i, kind) in sig.params.iter().enumerate() {
        // SAFETY: as in `tensor`.
        let a = unsafe { &*args.add(i) };
        let ti = a.type_index.0;
        // SAFETY: as in `tensor`.
        let raw = unsafe { a.value.v_int64 };
        let value = match kind {
            Kind::Tensor { .. } => {
                ok &= (ti == 70 || ti == 7) && raw != 0;
                0
            }
            Kind::Bool => {
                ok &= ti == 2 || ti == 1;
                raw as u64
            }
            Kind::Int => {
                ok &= ti == 1 || ti == 2;
                raw as u64
            }
            Kind::Float => {
                ok &= ti == 3 || ti == 1 || ti == 2;
                if ti == 3 {
                    raw as u64
                } else {
                    (raw as f64).to_bits()
                }
            }
            Kind::Handle => {
                ok &= matches!(ti, 0 | 4 | 7 | 70);
                raw as u64
            }
        };
        // SAFETY: `i < sig.slots` (one slot per parameter comes first).
        unsafe { *slots.add(i) = value };
    }
    if !ok && !trusted {
        return false;
    }
    // 3. ndim, dtype and device type of each tensor.
    for (i, kind) in sig.params.iter().enumerate() {
        if let Kind::Tensor {
            ndim,
            code,
            bits,
            lanes,
            ..
        } = kind
        {
            // SAFETY: the handle passed its checks (step 2): a readable DLTensor.
            let t = unsafe { &*tensor(i) };
            ok &= t.ndim == *ndim
                && t.dtype.code.0 == *code
                && t.dtype.bits == *bits
                && t.dtype.lanes == *lanes
                && t.device.device_type.0 == sig.device_type;
        }
    }
    if !ok && !trusted {
        return false;
    }
    // 4. Variables bound by scalars, then shapes, strides, device ids and data pointers. The
    // variables' values: on the stack for up to 16 (no allocation on a call).
    let mut inline = [None::<u64>; 16];
    let mut heap = Vec::new();
    let values: &mut [Option<u64>] = if sig.vars.len() <= inline.len() {
        &mut inline[..sig.vars.len()]
    } else {
        heap.resize(sig.vars.len(), None);
        &mut heap
    };
    for &(p, k) in &sig.scalar_binds {
        // SAFETY: written in step 2.
        let raw = unsafe { *slots.add(p) } as i64;
        values[k] = Some(low(raw, sig.vars[k].bits));
    }
    let bind = |d: Dim, actual: i64, values: &mut [Option<u64>]| -> bool {
        match d {
            Dim::Const(c) => actual == c,
            Dim::Var(k) => {
                let v = low(actual, sig.vars[k].bits);
                match values[k] {
                    Some(prev) => prev == v,
                    None => {
                        values[k] = Some(v);
                        // SAFETY: a variable's slot is below `sig.slots`.
                        unsafe { *slots.add(sig.vars[k].slot) = actual as u64 };
                        true
                    }
                }
            }
        }
    };
    let mut first_dev: Option<i32> = None;
    for (i, kind) in sig.params.iter().enumerate() {
        let Kind::Tensor { shape, strides, .. } = kind else {
            continue;
        };
        // SAFETY: as in step 3.
        let t = unsafe { &*tensor(i) };
        let nd = shape.len();
        // SAFETY: `ndim` matched (step 3): `shape` holds `nd` extents.
        let dim = |k: usize| unsafe { *t.shape.add(k) };
        for (k, d) in shape.iter().enumerate() {
            ok &= bind(*d, dim(k), values);
        }
        let has = !t.strides.is_null();
        // SAFETY: read only when `strides` is not NULL, below `ndim`.
        let stride = |k: usize| if has { unsafe { *t.strides.add(k) } } else { 0 };
        match strides {
            None => {
                let mut expect: i64 = 1;
                let mut compact = true;
                let mut empty = false;
                for k in (0..nd).rev() {
                    compact &= dim(k) == 1 || stride(k) == expect;
                    expect = expect.wrapping_mul(dim(k));
                    empty |= dim(k) == 0;
                }
                ok &= !has || compact || empty;
            }
            Some(sd) => {
                // The compact stride of dimension `k`: the product of the extents after it.
                let compact = |k: usize| (k + 1..nd).fold(1i64, |a, j| a.wrapping_mul(dim(j)));
                for (k, d) in sd.iter().enumerate() {
                    let actual = if has { stride(k) } else { compact(k) };
                    ok &= bind(*d, actual, values);
                }
            }
        }
        let dev = t.device.device_id;
        ok &= *first_dev.get_or_insert(dev) == dev;
        let numel = (0..nd).fold(1i64, |a, k| a.wrapping_mul(dim(k)));
        ok &= numel == 0 || !t.data.is_null();
        let data = (t.data as u64).wrapping_add(t.byte_offset);
        // SAFETY: the tensor's parameter index is below `sig.slots`.
        unsafe { *slots.add(i) = data };
    }
    ok || trusted
}
