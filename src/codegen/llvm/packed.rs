//! The packed-API wrapper of each function: decode and check the tvm-ffi arguments like TVM's
//! MakePackedAPI, then call the compute function.
//!
//! Checks, in order (messages as TVM 0.27 words them, so users' error handling keeps working):
//! argument count; per argument, its type index (tensors: 70 `ffi.Tensor` or 7 `DLTensor*`;
//! ints accept Int and Bool; floats accept Float, Int and Bool; bools accept Bool and Int); per
//! tensor, non-NULL, `ndim`, `dtype`, `device_type`; then shapes (constants, and symbolic
//! extents bound by their first appearance), strides (NULL or compact), `device_id` (all equal)
//! and a non-NULL data pointer when the tensor is not empty.
//!
//! Three deliberate differences from TVM, all safe: a non-zero `byte_offset` is honoured (added
//! to `data`) instead of rejected; the strides of an empty tensor are not checked (numpy gives
//! them stride 0, which TVM rejects as non-compact); and only Tensor (70) and `DLTensor*` (7)
//! arguments are read as tensors (TVM reinterprets any object, e.g. a Shape, as a DLTensor and
//! reads past it). Like TVM, the strides of extent-1 dimensions are ignored.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::ir::{Expr, Param, PrimFunc, TypeCode, VarId};

use super::super::CodegenError;
use super::emit::{mem_ty, reg_ty, Emitter, Val};
use super::quick::{QuickSig, Source};

/// The `name(a: Tensor([16], float32), n: int32)` signature used in messages.
pub fn signature(f: &PrimFunc) -> String {
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| match p {
            Param::Buffer(b) => {
                let dims: Vec<String> = b.shape.iter().map(shape_text).collect();
                format!("{}: Tensor([{}], {})", b.name, dims.join(", "), b.dtype)
            }
            Param::Scalar(v) => format!("{}: {}", v.name, v.dtype),
        })
        .collect();
    format!("{}({})", f.name, params.join(", "))
}

fn shape_text(e: &Expr) -> String {
    match e {
        Expr::IntImm { value, .. } => value.to_string(),
        Expr::Var(v) => v.name.to_string(),
        other => other.to_string(),
    }
}

/// How [`emit`] writes the checks.
pub enum Mode<'a> {
    /// The checker: every check branches to a block that raises its error; `ret i32 0` when
    /// all pass.
    Checker,
    /// A JIT module's quick wrapper where kiln's decoder does not describe the signature
    /// (device host code; else [`emit_quick`]), built for compile speed: checks are and-ed
    /// without messages; at
    /// each barrier (before reading memory the checks so far vouch for) one branch leads to
    /// `slow`, which calls the checker, which raises the precise error; then the compute
    /// function is called through the pointer at `compute_slot`.
    Conjunction {
        /// The checker call: an `i32`-valued instruction that reads `%args` and `%num_args`.
        slow: &'a str,
        /// The address of the slot holding the compute function's address.
        compute_slot: usize,
    },
    /// An exported library's wrapper, built for call speed: each check is one compare and
    /// branch to `slow` (the checker's call), without a message, and the fields that each
    /// tensor compares with constants are compared as two 8-byte words (`device_type` with
    /// `device_id`, `ndim` with `dtype`); some checks are stricter than the checker's (a NULL
    /// data pointer, non-NULL strides of a tensor that may be empty) and leave the rare
    /// exceptions to it. Then the compute function is called directly.
    Branches {
        /// The checker call: an `i32`-valued instruction that reads `%args` and `%num_args`.
        slow: &'a str,
    },
}

/// How a [`Ctx`] emits a check.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// A branch to its own error ([`Mode::Checker`]).
    Exact,
    /// One more conjunct ([`Mode::Conjunction`]).
    Conjunction,
    /// A branch to the block `slow`, which calls the checker ([`Mode::Branches`]).
    Branches,
    /// None: the checker has passed the arguments ([`Mode::Branches`]' slow path).
    Trusted,
}

struct Ctx<'a, 'm> {
    e: &'a mut Emitter<'m>,
    sig: String,
    style: Style,
    /// The conjunction so far ([`Style::Conjunction`]).
    pending: String,
    slow: String,
}

impl Ctx<'_, '_> {
    /// Whether checks have no messages (a wrapper rather than the checker).
    fn fast(&self) -> bool {
        self.style != Style::Exact
    }

    /// A check: in the checker a branch to its error; in the JIT's wrapper one more conjunct;
    /// in an exported one a branch to the checker's call.
    fn require(&mut self, ok: &str, kind: &str, m: impl FnOnce() -> String) {
        match self.style {
            Style::Exact => {
                let m = m();
                self.e.check(ok, kind, &m);
            }
            Style::Conjunction if self.pending == "true" => self.pending = ok.to_owned(),
            Style::Conjunction => {
                let acc = self.pending.clone();
                let a = self.e.assign("i1", format!("and i1 {acc}, {ok}"));
                self.pending = a.v;
            }
            Style::Branches => {
                let cont = self.e.new_label("checked");
                self.e
                    .line(format!("br i1 {ok}, label %{cont}, label %slow, !prof !0"));
                self.e.start_block(&cont);
            }
            Style::Trusted => {}
        }
    }

    /// Before reading memory that the checks so far vouch for: in the JIT's wrapper, one
    /// branch to the checker when any failed.
    fn barrier(&mut self) {
        if self.style != Style::Conjunction {
            return;
        }
        let acc = std::mem::replace(&mut self.pending, "true".into());
        if acc == "true" {
            return;
        }
        // The checker returns its error or, should it find none after all, the fast path goes
        // on where it left off.
        let slow = self.e.new_label("slow");
        let cont = self.e.new_label("checked");
        let out = self.e.new_label("slowret");
        self.e.line(format!(
            "br i1 {acc}, label %{cont}, label %{slow}, !prof !0"
        ));
        self.e.start_block(&slow);
        let call = self.slow.clone();
        let r = self.e.assign("i32", call);
        let z = self.e.assign("i1", format!("icmp eq i32 {}, 0", r.v));
        self.e
            .line(format!("br i1 {}, label %{cont}, label %{out}", z.v));
        self.e.start_block(&out);
        self.e.line(format!("ret i32 {}", r.v));
        self.e.start_block(&cont);
    }

    fn msg(&self, prefix: &str, index: usize, expected: Option<&str>) -> String {
        let mut m = format!(
            "{prefix} on argument #{index} when calling:\n  `{}`",
            self.sig
        );
        if let Some(x) = expected {
            let _ = write!(m, ",\n  expected {x}");
        }
        m
    }

    fn check(&mut self, ok: &str, kind: &str, prefix: &str, index: usize, expected: Option<&str>) {
        // The wrappers have no messages.
        let m = if !self.fast() {
            self.msg(prefix, index, expected)
        } else {
            String::new()
        };
        self.require(ok, kind, || m);
    }

    /// `a || b || ...` over `icmp eq i32 %ti, k`.
    fn ti_in(&mut self, ti: &str, set: &[i32]) -> String {
        let mut acc: Option<Val> = None;
        for k in set {
            let c = self.e.assign("i1", format!("icmp eq i32 {ti}, {k}"));
            acc = Some(match acc {
                None => c,
                Some(a) => self.e.assign("i1", format!("or i1 {}, {}", a.v, c.v)),
            });
        }
        acc.map(|a| a.v).unwrap_or_else(|| "false".into())
    }

    /// `strides[k]`, read only when the strides pointer is non-NULL (else from a zero constant).
    fn stride(&mut self, strides: &str, has_strides: &str, k: usize) -> Val {
        let sp = self.e.assign(
            "i64*",
            format!("getelementptr inbounds i64, i64* {strides}, i64 {k}"),
        );
        let safe = self.e.assign(
            "i64*",
            format!(
                "select i1 {has_strides}, i64* {}, i64* @__kiln_zero_i64",
                sp.v
            ),
        );
        self.e
            .assign("i64", format!("load i64, i64* {}, align 8", safe.v))
    }

    /// The `i64` that is `parts` (integers, each zero-extended and shifted left by its amount)
    /// or-ed: adjacent fields of one struct become one 8-byte load.
    fn word(&mut self, parts: &[(&Val, u32)]) -> String {
        let mut acc: Option<String> = None;
        for (v, shift) in parts {
            let z = self.e.assign("i64", format!("zext {} to i64", v.typed()));
            let s = if *shift == 0 {
                z.v
            } else {
                self.e.assign("i64", format!("shl i64 {}, {shift}", z.v)).v
            };
            acc = Some(match acc {
                None => s,
                Some(a) => self.e.assign("i64", format!("or i64 {a}, {s}")).v,
            });
        }
        acc.unwrap_or_else(|| "0".into())
    }

    /// Field `idx` of the DLTensor at `t`, of type `ty`.
    fn field(&mut self, t: &str, idx: usize, ty: &str) -> Val {
        // Each field's alignment in `%dl.tensor` (an 8-aligned struct).
        const ALIGN: [u32; 10] = [8, 8, 4, 8, 4, 1, 2, 8, 8, 8];
        let p = self.e.assign(
            "",
            format!("getelementptr inbounds %dl.tensor, %dl.tensor* {t}, i32 0, i32 {idx}"),
        );
        let align = ALIGN[idx];
        self.e
            .assign(ty, format!("load {ty}, {ty}* {}, align {align}", p.v))
    }
}

/// Emits the body of `__tvm_ffi_<symbol>` ([`Mode::Conjunction`] or [`Mode::Branches`],
/// which call the compute function, whose signature they return) or of its checker
/// ([`Mode::Checker`]) for `f`.
///
/// Every mode runs the same checks in the same order, so all accept the same arguments (the
/// exported wrapper's few stricter checks hand the exceptions to the checker); the wrappers
/// evaluate them without messages, and leave the error, with TVM's message, to the checker.
pub fn emit(
    f: &PrimFunc,
    e: &mut Emitter<'_>,
    mode: Mode<'_>,
    cname: &str,
) -> Result<ComputeSig, CodegenError> {
    let sig = signature(f);
    let (style, slow, compute_slot) = match mode {
        Mode::Checker => (Style::Exact, String::new(), None),
        Mode::Conjunction { slow, compute_slot } => {
            (Style::Conjunction, slow.to_owned(), Some(compute_slot))
        }
        Mode::Branches { slow } => (Style::Branches, slow.to_owned(), None),
    };
    let mut c = Ctx {
        e,
        sig,
        style,
        pending: "true".into(),
        slow,
    };
    let d = decode(&mut c, f)?;
    let args: Vec<Val> = match style {
        Style::Exact => {
            c.e.line("ret i32 0");
            return Ok(ComputeSig {
                name: String::new(),
                params: String::new(),
                buffers: Vec::new(),
                vars: Vec::new(),
            });
        }
        Style::Conjunction | Style::Trusted => d.args.clone(),
        Style::Branches => {
            // The fast path, then the slow one: the checker raises the error; should it find
            // none (one of the stricter checks' exceptions), the arguments are decoded again
            // without checks. Both meet at the call with their values.
            let fast_end = c.e.new_label("fast");
            c.e.line(format!("br label %{fast_end}"));
            c.e.start_block(&fast_end);
            c.e.line("br label %call");
            c.e.start_block("slow");
            let call = c.slow.clone();
            let r = c.e.assign("i32", call);
            let z = c.e.assign("i1", format!("icmp eq i32 {}, 0", r.v));
            c.e.line(format!("br i1 {}, label %trusted, label %failed", z.v));
            c.e.start_block("failed");
            c.e.line(format!("ret i32 {}", r.v));
            c.e.start_block("trusted");
            c.style = Style::Trusted;
            let t = decode(&mut c, f)?;
            let trusted_end = c.e.new_label("trusted");
            c.e.line(format!("br label %{trusted_end}"));
            c.e.start_block(&trusted_end);
            c.e.line("br label %call");
            c.e.start_block("call");
            d.args
                .iter()
                .zip(&t.args)
                .map(|(x, y)| {
                    c.e.assign(
                        &x.ty,
                        format!(
                            "phi {} [{}, %{fast_end}], [{}, %{trusted_end}]",
                            x.ty, x.v, y.v
                        ),
                    )
                })
                .collect()
        }
    };
    let Decoded {
        mut params,
        buffers,
        vars,
        ..
    } = d;
    params.push("i8* %ret_slot".into());
    let rp = c.e.assign("i8*", "bitcast %ffi.any* %ret to i8*");
    let mut args_text: Vec<String> = args.iter().map(Val::typed).collect();
    args_text.push(rp.typed());
    let args_text = args_text.join(", ");
    let callee = match compute_slot {
        None => format!("@\"{cname}\""),
        Some(addr) => {
            // The parameter types, without names and attributes.
            let types: Vec<&str> = params
                .iter()
                .map(|p| {
                    let ty = p.rsplit_once(" %").map_or(p.as_str(), |(ty, _)| ty);
                    ty.trim_end_matches(" noalias")
                })
                .collect();
            let fty = format!("i32 ({})*", types.join(", "));
            // Acquire: pairs with the release store that installs re-optimized code.
            let p = c.e.assign(
                "i8*",
                format!("load atomic i8*, i8** inttoptr (i64 {addr} to i8**) acquire, align 8"),
            );
            c.e.assign(&fty, format!("bitcast i8* {} to {fty}", p.v)).v
        }
    };
    let rc = c.e.assign("i32", format!("call i32 {callee}({args_text})"));
    c.e.line(format!("ret i32 {}", rc.v));
    Ok(ComputeSig {
        name: cname.to_owned(),
        params: params.join(", "),
        buffers,
        vars,
    })
}

/// The decoded arguments: what the wrapper passes to the compute function (before its return
/// slot).
struct Decoded {
    /// The values, in parameter order.
    args: Vec<Val>,
    /// The compute function's parameters (with names and attributes).
    params: Vec<String>,
    /// Buffer data variables and their typed-pointer types.
    buffers: Vec<(VarId, String)>,
    /// Bound variables and their types.
    vars: Vec<(VarId, String)>,
}

/// Checks and decodes the arguments (`%args`, `%num_args`) of `f` in `c`'s style.
fn decode(c: &mut Ctx<'_, '_>, f: &PrimFunc) -> Result<Decoded, CodegenError> {
    let sig = c.sig.clone();
    let n = f.params.len();
    let opts = c.e.opts;
    // 1. Count.
    let ok = c.e.assign("i1", format!("icmp eq i32 %num_args, {n}"));
    c.require(&ok.v, "TypeError", || {
        format!("Expected {n} arguments when calling:\n  `{sig}`")
    });
    if n > 0 {
        let nn = c.e.assign("i1", "icmp ne %ffi.any* %args, null");
        c.require(&nn.v, "TypeError", || {
            format!("args pointer is NULL when calling:\n  `{sig}`")
        });
    }
    c.barrier();
    // 2. Type indices and handles.
    let mut tensors: Vec<(usize, String)> = Vec::new();
    let mut compute_args: Vec<Val> = Vec::new();
    let mut compute_params: Vec<String> = Vec::new();
    let mut buffer_params: Vec<(VarId, String)> = Vec::new();
    let mut bound: HashMap<VarId, (Val, String)> = HashMap::new();
    let mut scalars: Vec<(usize, Val)> = Vec::new();
    for (i, p) in f.params.iter().enumerate() {
        let ap = c.e.assign(
            "",
            format!("getelementptr inbounds %ffi.any, %ffi.any* %args, i64 {i}"),
        );
        let tip = c.e.assign(
            "",
            format!(
                "getelementptr inbounds %ffi.any, %ffi.any* {}, i32 0, i32 0",
                ap.v
            ),
        );
        let ti =
            c.e.assign("i32", format!("load i32, i32* {}, align 8", tip.v));
        let vp = c.e.assign(
            "",
            format!(
                "getelementptr inbounds %ffi.any, %ffi.any* {}, i32 0, i32 2",
                ap.v
            ),
        );
        let raw =
            c.e.assign("i64", format!("load i64, i64* {}, align 8", vp.v));
        match p {
            Param::Buffer(_) => {
                let ok = c.ti_in(&ti.v, &[70, 7]);
                c.check(&ok, "TypeError", "Mismatched type", i, Some("Tensor"));
                let is_obj = c.e.assign("i1", format!("icmp eq i32 {}, 70", ti.v));
                let off =
                    c.e.assign("i64", format!("select i1 {}, i64 24, i64 0", is_obj.v));
                let addr = c.e.assign("i64", format!("add i64 {}, {}", raw.v, off.v));
                let t = c.e.assign(
                    "%dl.tensor*",
                    format!("inttoptr i64 {} to %dl.tensor*", addr.v),
                );
                let nn = c.e.assign("i1", format!("icmp ne i64 {}, 0", raw.v));
                c.check(&nn.v, "TypeError", "Mismatched type", i, Some("Tensor"));
                tensors.push((i, t.v));
            }
            Param::Scalar(v) => {
                let t = v.dtype;
                let val = match t.code {
                    TypeCode::Bool => {
                        let ok = c.ti_in(&ti.v, &[2, 1]);
                        c.check(&ok, "TypeError", "Mismatched type", i, Some("boolean"));
                        c.e.assign("i1", format!("icmp ne i64 {}, 0", raw.v))
                    }
                    TypeCode::Int | TypeCode::UInt => {
                        let ok = c.ti_in(&ti.v, &[1, 2]);
                        c.check(&ok, "TypeError", "Mismatched type", i, Some("int"));
                        if t.bits == 64 {
                            raw.clone()
                        } else {
                            c.e.assign(&reg_ty(t), format!("trunc i64 {} to {}", raw.v, reg_ty(t)))
                        }
                    }
                    TypeCode::Float | TypeCode::BFloat => {
                        let ok = c.ti_in(&ti.v, &[3, 1, 2]);
                        c.check(&ok, "TypeError", "Mismatched type", i, Some("float"));
                        let isf = c.e.assign("i1", format!("icmp eq i32 {}, 3", ti.v));
                        let d =
                            c.e.assign("double", format!("bitcast i64 {} to double", raw.v));
                        let fi =
                            c.e.assign("double", format!("sitofp i64 {} to double", raw.v));
                        let dv = c.e.assign(
                            "double",
                            format!("select i1 {}, double {}, double {}", isf.v, d.v, fi.v),
                        );
                        let ty = reg_ty(t);
                        if ty == "double" {
                            dv
                        } else {
                            c.e.assign(&ty, format!("fptrunc double {} to {ty}", dv.v))
                        }
                    }
                    TypeCode::Handle => {
                        let ok = c.ti_in(&ti.v, &[0, 4, 7, 70]);
                        c.check(&ok, "TypeError", "Mismatched type", i, Some("pointer"));
                        c.e.assign("i8*", format!("inttoptr i64 {} to i8*", raw.v))
                    }
                };
                scalars.push((i, val));
            }
        }
    }
    c.barrier();
    // 3. Per-tensor ndim, dtype, device type.
    // (i, t, (shape*, strides*) unless read where used, dev_id)
    type TensorInfo = (usize, String, Option<(Val, Val)>, Val);
    let mut tinfo: Vec<TensorInfo> = Vec::new();
    // An exported wrapper: the first tensor's (device_type, device_id) word, which every other
    // tensor's must equal.
    let mut device_word: Option<String> = None;
    let words = c.style == Style::Branches;
    for (i, t) in &tensors {
        let Param::Buffer(b) = &f.params[*i] else {
            unreachable!("tensors are buffers")
        };
        if words {
            // ndim and dtype in one word, then device_type and device_id in another (the
            // device_id check of step 4, done here: it reads nothing more).
            let nd = c.field(t, 3, "i32");
            let code = c.field(t, 4, "i8");
            let bits = c.field(t, 5, "i8");
            let lanes = c.field(t, 6, "i16");
            let w = c.word(&[(&nd, 0), (&code, 32), (&bits, 40), (&lanes, 48)]);
            let dt = b.dtype;
            let expect = u64::from(b.ndim() as u32)
                | u64::from(dt.code as u8) << 32
                | u64::from(dt.bits) << 40
                | u64::from(dt.lanes) << 48;
            let ok =
                c.e.assign("i1", format!("icmp eq i64 {w}, {}", expect as i64));
            c.require(&ok.v, "", String::new);
            let devt = c.field(t, 1, "i32");
            let devid = c.field(t, 2, "i32");
            let dw = c.word(&[(&devt, 0), (&devid, 32)]);
            let ok = match &device_word {
                Some(first) => c.e.assign("i1", format!("icmp eq i64 {dw}, {first}")),
                None => {
                    device_word = Some(dw);
                    let x = opts.device_type;
                    c.e.assign("i1", format!("icmp eq i32 {}, {x}", devt.v))
                }
            };
            c.require(&ok.v, "", String::new);
            // The shape and strides pointers are read where they are used (fewer registers).
            tinfo.push((*i, t.clone(), None, devid));
            continue;
        }
        let nd = c.field(t, 3, "i32");
        let ok =
            c.e.assign("i1", format!("icmp eq i32 {}, {}", nd.v, b.ndim()));
        let nm = format!("Mismatched {}.ndim", b.name);
        c.check(&ok.v, "ValueError", &nm, *i, Some(&b.ndim().to_string()));
        let code = c.field(t, 4, "i8");
        let bits = c.field(t, 5, "i8");
        let lanes = c.field(t, 6, "i16");
        let dt = b.dtype;
        let c1 =
            c.e.assign("i1", format!("icmp eq i8 {}, {}", code.v, dt.code as u8));
        let c2 =
            c.e.assign("i1", format!("icmp eq i8 {}, {}", bits.v, dt.bits as i8));
        let c3 =
            c.e.assign("i1", format!("icmp eq i16 {}, {}", lanes.v, dt.lanes));
        let a = c.e.assign("i1", format!("and i1 {}, {}", c1.v, c2.v));
        let ok = c.e.assign("i1", format!("and i1 {}, {}", a.v, c3.v));
        let nm = format!("Mismatched {}.dtype", b.name);
        c.check(&ok.v, "TypeError", &nm, *i, Some(&dt.to_string()));
        let devt = c.field(t, 1, "i32");
        let ok = c.e.assign(
            "i1",
            format!("icmp eq i32 {}, {}", devt.v, opts.device_type),
        );
        let nm = format!("Mismatched {}.device_type", b.name);
        c.check(&ok.v, "ValueError", &nm, *i, Some(&opts.device_name));
        let devid = c.field(t, 2, "i32");
        let sp = c.e.assign(
            "",
            format!("getelementptr inbounds %dl.tensor, %dl.tensor* {t}, i32 0, i32 7"),
        );
        let shape =
            c.e.assign("i64*", format!("load i64*, i64** {}, align 8", sp.v));
        let stp = c.e.assign(
            "",
            format!("getelementptr inbounds %dl.tensor, %dl.tensor* {t}, i32 0, i32 8"),
        );
        let strides =
            c.e.assign("i64*", format!("load i64*, i64** {}, align 8", stp.v));
        tinfo.push((*i, t.clone(), Some((shape, strides)), devid));
    }
    c.barrier();
    // Scalars bind their variables first (in parameter order they come before or after tensors;
    // either way a shape variable that is also a scalar parameter is checked against it).
    for (i, val) in &scalars {
        if let Param::Scalar(v) = &f.params[*i] {
            bound.insert(v.id, (val.clone(), v.name.to_string()));
        }
    }
    // 4. Shapes, strides, device ids, data pointers.
    let first_dev: Option<(String, Val)> = tinfo.first().map(|(i, _, _, d)| {
        let Param::Buffer(b) = &f.params[*i] else {
            unreachable!("tensors are buffers")
        };
        (b.name.clone(), d.clone())
    });
    for (i, t, pointers, devid) in &tinfo {
        let Param::Buffer(b) = &f.params[*i] else {
            unreachable!("tensors are buffers")
        };
        let (shape, strides) = match pointers {
            Some((shape, strides)) => (shape.clone(), strides.clone()),
            None => (c.field(t, 7, "i64*"), c.field(t, 8, "i64*")),
        };
        let mut dims: Vec<Val> = Vec::new();
        for (k, sexpr) in b.shape.iter().enumerate() {
            let p = c.e.assign(
                "i64*",
                format!("getelementptr inbounds i64, i64* {}, i64 {k}", shape.v),
            );
            let d =
                c.e.assign("i64", format!("load i64, i64* {}, align 8", p.v));
            dims.push(d.clone());
            bind_or_check(
                c,
                sexpr,
                d,
                &format!("{}.shape[{k}]", b.name),
                *i,
                &mut bound,
            )?;
        }
        // Strides.
        let hasst =
            c.e.assign("i1", format!("icmp ne i64* {}, null", strides.v));
        match &b.strides {
            None if words => {
                // Read only when present; non-compact strides of an empty tensor, which the
                // checker accepts, are left to it.
                let chk = c.e.new_label("strides");
                let done = c.e.new_label("stridesok");
                c.e.line(format!("br i1 {}, label %{chk}, label %{done}", hasst.v));
                c.e.start_block(&chk);
                let mut expect = Val::new("i64", "1");
                for k in (0..dims.len()).rev() {
                    let sp = c.e.assign(
                        "i64*",
                        format!("getelementptr inbounds i64, i64* {}, i64 {k}", strides.v),
                    );
                    let s =
                        c.e.assign("i64", format!("load i64, i64* {}, align 8", sp.v));
                    let unit = c.e.assign("i1", format!("icmp eq i64 {}, 1", dims[k].v));
                    let eq =
                        c.e.assign("i1", format!("icmp eq i64 {}, {}", s.v, expect.v));
                    let fine = c.e.assign("i1", format!("or i1 {}, {}", eq.v, unit.v));
                    c.require(&fine.v, "", String::new);
                    if k > 0 {
                        expect =
                            c.e.assign("i64", format!("mul i64 {}, {}", expect.v, dims[k].v));
                    }
                }
                c.e.line(format!("br label %{done}"));
                c.e.start_block(&done);
            }
            None => {
                // compact: every non-unit dimension's stride equals the product of the extents after it
                let mut expect = Val::new("i64", "1");
                let mut ok = Val::new("i1", "true");
                let mut empty = Val::new("i1", "false");
                for k in (0..dims.len()).rev() {
                    let s = c.stride(&strides.v, &hasst.v, k);
                    let unit = c.e.assign("i1", format!("icmp eq i64 {}, 1", dims[k].v));
                    let eq =
                        c.e.assign("i1", format!("icmp eq i64 {}, {}", s.v, expect.v));
                    let fine = c.e.assign("i1", format!("or i1 {}, {}", unit.v, eq.v));
                    ok = c.e.assign("i1", format!("and i1 {}, {}", ok.v, fine.v));
                    expect =
                        c.e.assign("i64", format!("mul i64 {}, {}", expect.v, dims[k].v));
                    let z = c.e.assign("i1", format!("icmp eq i64 {}, 0", dims[k].v));
                    empty = c.e.assign("i1", format!("or i1 {}, {}", empty.v, z.v));
                }
                let nost = c.e.assign("i1", format!("xor i1 {}, true", hasst.v));
                let a = c.e.assign("i1", format!("or i1 {}, {}", nost.v, ok.v));
                let all = c.e.assign("i1", format!("or i1 {}, {}", a.v, empty.v));
                let nm = format!("Mismatched {}.strides", b.name);
                c.check(&all.v, "ValueError", &nm, *i, Some("to be compact array"));
            }
            Some(sexprs) => {
                // explicit strides: from the tensor, or compact ones when it has none
                let mut compact = vec![Val::new("i64", "1"); dims.len()];
                for k in (0..dims.len().saturating_sub(1)).rev() {
                    compact[k] = c.e.assign(
                        "i64",
                        format!("mul i64 {}, {}", compact[k + 1].v, dims[k + 1].v),
                    );
                }
                for (k, sexpr) in sexprs.iter().enumerate() {
                    let s = c.stride(&strides.v, &hasst.v, k);
                    let actual = c.e.assign(
                        "i64",
                        format!("select i1 {}, i64 {}, i64 {}", hasst.v, s.v, compact[k].v),
                    );
                    bind_or_check(
                        c,
                        sexpr,
                        actual,
                        &format!("{}.strides[{k}]", b.name),
                        *i,
                        &mut bound,
                    )?;
                }
            }
        }
        if let Some((fname, fdev)) = first_dev.as_ref().filter(|_| !words) {
            if fname != &b.name {
                let ok =
                    c.e.assign("i1", format!("icmp eq i32 {}, {}", devid.v, fdev.v));
                let nm = format!("Mismatched {}.device_id", b.name);
                let x = format!("to match {fname}.device_id");
                c.check(&ok.v, "ValueError", &nm, *i, Some(&x));
            }
        }
        // Data pointer: non-NULL unless the tensor is empty; byte_offset honoured.
        let dp = c.field(t, 0, "i8*");
        let bop = c.e.assign(
            "",
            format!("getelementptr inbounds %dl.tensor, %dl.tensor* {t}, i32 0, i32 9"),
        );
        let bo =
            c.e.assign("i64", format!("load i64, i64* {}, align 8", bop.v));
        let nn = c.e.assign("i1", format!("icmp ne i8* {}, null", dp.v));
        if words {
            // A NULL data pointer of an empty tensor, which the checker accepts, is left to it.
            c.require(&nn.v, "", String::new);
        } else {
            let mut numel = Val::new("i64", "1");
            for d in &dims {
                numel = c.e.assign("i64", format!("mul i64 {}, {}", numel.v, d.v));
            }
            let empty = c.e.assign("i1", format!("icmp eq i64 {}, 0", numel.v));
            let ok = c.e.assign("i1", format!("or i1 {}, {}", empty.v, nn.v));
            let nm = format!("{} data pointer is NULL", b.name);
            c.check(&ok.v, "ValueError", &nm, *i, Some("non-NULL data pointer"));
        }
        if c.e.opts.device_host {
            // Device memory is a handle: an offset into it cannot be added on the host.
            let ok = c.e.assign("i1", format!("icmp eq i64 {}, 0", bo.v));
            let nm = format!("Invalid {}.byte_offset", b.name);
            c.check(
                &ok.v,
                "ValueError",
                &nm,
                *i,
                Some("0 (device tensors are handles)"),
            );
        }
        let data = c.e.assign(
            "i8*",
            format!("getelementptr i8, i8* {}, i64 {}", dp.v, bo.v),
        );
        let mt = mem_ty(b.dtype);
        let typed = c.e.assign(
            &format!("{mt}*"),
            format!("bitcast i8* {} to {mt}*", data.v),
        );
        let na = if f.attrs.noalias { " noalias" } else { "" };
        compute_params.push(format!("{mt}*{na} %buf{}", b.data.id.0));
        buffer_params.push((b.data.id, format!("{mt}*")));
        compute_args.push(typed);
    }
    c.barrier();
    // 5. Every bound variable the body may use.
    let mut ids: Vec<&VarId> = bound.keys().collect();
    ids.sort();
    let mut var_params: Vec<(VarId, String)> = Vec::new();
    for id in ids {
        let (v, _) = &bound[id];
        compute_params.push(format!("{} %var{}", v.ty, id.0));
        compute_args.push(v.clone());
        var_params.push((*id, v.ty.clone()));
    }
    if c.e.opts.device_host {
        // The device the kernels launch on: the tensors' (checked equal above).
        let dev = first_dev
            .as_ref()
            .map_or_else(|| "0".to_owned(), |(_, d)| d.v.clone());
        compute_params.push("i32 %devid".into());
        compute_args.push(Val::new("i32", dev));
    }
    Ok(Decoded {
        args: compute_args,
        params: compute_params,
        buffers: buffer_params,
        vars: var_params,
    })
}

/// What the packed wrapper passes to the compute function.
#[derive(Debug, PartialEq, Eq)]
pub struct ComputeSig {
    /// The compute function's name.
    pub name: String,
    /// Its parameter list text.
    pub params: String,
    /// Buffer data variables and their typed-pointer types, in parameter order.
    pub buffers: Vec<(VarId, String)>,
    /// Bound variables and their types, in parameter order (after the buffers).
    pub vars: Vec<(VarId, String)>,
}

/// Binds a shape/stride variable on first sight, or checks a constant or an already bound one.
fn bind_or_check(
    c: &mut Ctx<'_, '_>,
    sexpr: &Expr,
    actual: Val,
    what: &str,
    index: usize,
    bound: &mut HashMap<VarId, (Val, String)>,
) -> Result<(), CodegenError> {
    match sexpr {
        Expr::IntImm { value, .. } => {
            let ok = c.e.assign("i1", format!("icmp eq i64 {}, {value}", actual.v));
            let nm = format!("Invalid {what}");
            c.check(&ok.v, "ValueError", &nm, index, Some(&value.to_string()));
        }
        Expr::Var(v) => {
            let ty = reg_ty(v.dtype);
            let val = if ty == "i64" {
                actual
            } else {
                c.e.assign(&ty, format!("trunc i64 {} to {ty}", actual.v))
            };
            match bound.get(&v.id) {
                Some((prev, where_)) => {
                    let ok = c.e.assign("i1", format!("icmp eq {}, {}", prev.typed(), val.v));
                    let nm = format!("Mismatched {what}");
                    let x = format!("to match {where_}");
                    c.check(&ok.v, "ValueError", &nm, index, Some(&x));
                }
                None => {
                    bound.insert(v.id, (val, what.to_owned()));
                }
            }
        }
        other => {
            return Err(CodegenError::Unsupported(format!(
                "{what} is `{other}`: buffer parameters' shapes and strides must be constants or variables"
            )))
        }
    }
    Ok(())
}

/// The quick tier's wrapper of `f` when the decoder describes its signature (`quick.rs`):
/// one call of the decoder (at address `decode.0`, with the checker context `decode.1` and the
/// function's index `decode.2`, then `%args`, `%num_args`, the slots and `trusted`), and on a
/// rejection the
/// checker (`slow`) and, should it pass the arguments, the decoder again in trusted mode; then
/// the compute function, through the pointer at `compute_slot`, with the slots converted to
/// its parameters as [`Mode::Conjunction`]'s wrapper converts the arguments. Returns the same
/// signature as [`emit`] does for `f`.
pub(crate) fn emit_quick(
    f: &PrimFunc,
    e: &mut Emitter<'_>,
    q: &QuickSig,
    decode: (usize, usize, usize),
    slow: &str,
    compute_slot: usize,
    cname: &str,
) -> ComputeSig {
    let (entry, cx, index) = decode;
    let n = q.slots;
    let slots = e.assign("i64*", format!("alloca [{n} x i64], align 8"));
    let base = e.assign(
        "i64*",
        format!(
            "getelementptr inbounds [{n} x i64], [{n} x i64]* {}, i64 0, i64 0",
            slots.v
        ),
    );
    let call = |e: &mut Emitter<'_>, trusted: u32| {
        e.assign(
            "i32",
            format!(
                "call i32 inttoptr (i64 {entry} to i32 (i8*, i32, %ffi.any*, i32, i64*, i32)*)(i8* inttoptr (i64 {cx} to i8*), i32 {index}, %ffi.any* %args, i32 %num_args, i64* {}, i32 {trusted})",
                base.v
            ),
        )
    };
    let ok = call(e, 0);
    let good = e.assign("i1", format!("icmp ne i32 {}, 0", ok.v));
    e.line(format!(
        "br i1 {}, label %call, label %slow, !prof !0",
        good.v
    ));
    e.start_block("slow");
    let r = e.assign("i32", slow);
    let z = e.assign("i1", format!("icmp eq i32 {}, 0", r.v));
    e.line(format!("br i1 {}, label %trusted, label %failed", z.v));
    e.start_block("failed");
    e.line(format!("ret i32 {}", r.v));
    e.start_block("trusted");
    // 1, unless the decoder raised (a kiln bug: it reports it).
    let t = call(e, 1);
    let tok = e.assign("i1", format!("icmp eq i32 {}, 1", t.v));
    e.line(format!("br i1 {}, label %call, label %raised", tok.v));
    e.start_block("raised");
    e.line("ret i32 -1");
    e.start_block("call");
    // The compute function's parameters, and the slots converted to them, in the decoder's
    // order (each tensor's data, then every bound variable by id: `decode`'s).
    let na = if f.attrs.noalias { " noalias" } else { "" };
    let mut params: Vec<String> = Vec::new();
    let mut types: Vec<String> = Vec::new();
    let mut buffers: Vec<(VarId, String)> = Vec::new();
    let mut vars: Vec<(VarId, String)> = Vec::new();
    let mut args: Vec<String> = Vec::with_capacity(q.args.len() + 1);
    let slot = |e: &mut Emitter<'_>, k: usize| {
        let p = e.assign(
            "i64*",
            format!("getelementptr inbounds i64, i64* {}, i64 {k}", base.v),
        );
        e.assign("i64", format!("load i64, i64* {}, align 8", p.v))
    };
    for src in &q.args {
        let v = match *src {
            Source::Data {
                slot: k,
                buf,
                dtype,
            } => {
                let ty = format!("{}*", mem_ty(dtype));
                params.push(format!("{ty}{na} %buf{}", buf.0));
                buffers.push((buf, ty.clone()));
                let raw = slot(e, k);
                e.assign(&ty, format!("inttoptr i64 {} to {ty}", raw.v))
            }
            Source::Extent {
                slot: k,
                var,
                dtype,
            }
            | Source::Scalar {
                slot: k,
                var,
                dtype,
            } => {
                let ty = reg_ty(dtype);
                params.push(format!("{ty} %var{}", var.0));
                vars.push((var, ty.clone()));
                let raw = slot(e, k);
                let scalar = matches!(src, Source::Scalar { .. });
                match dtype.code {
                    TypeCode::Bool if scalar => e.assign("i1", format!("icmp ne i64 {}, 0", raw.v)),
                    TypeCode::Float | TypeCode::BFloat if scalar => {
                        let d = e.assign("double", format!("bitcast i64 {} to double", raw.v));
                        if ty == "double" {
                            d
                        } else {
                            e.assign(&ty, format!("fptrunc double {} to {ty}", d.v))
                        }
                    }
                    TypeCode::Handle if scalar => {
                        e.assign("i8*", format!("inttoptr i64 {} to i8*", raw.v))
                    }
                    // Integers (an extent's variable is one).
                    _ if ty == "i64" => raw,
                    _ => e.assign(&ty, format!("trunc i64 {} to {ty}", raw.v)),
                }
            }
        };
        types.push(v.ty.clone());
        args.push(v.typed());
    }
    let rp = e.assign("i8*", "bitcast %ffi.any* %ret to i8*");
    args.push(rp.typed());
    types.push("i8*".into());
    let fty = format!("i32 ({})*", types.join(", "));
    let p = e.assign(
        "i8*",
        format!("load atomic i8*, i8** inttoptr (i64 {compute_slot} to i8**) acquire, align 8"),
    );
    let callee = e.assign(&fty, format!("bitcast i8* {} to {fty}", p.v));
    let rc = e.assign("i32", format!("call i32 {}({})", callee.v, args.join(", ")));
    e.line(format!("ret i32 {}", rc.v));
    params.push("i8* %ret_slot".into());
    ComputeSig {
        name: cname.to_owned(),
        params: params.join(", "),
        buffers,
        vars,
    }
}
