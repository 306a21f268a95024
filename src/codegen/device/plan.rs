//! The kernel plan: which loop nests of a function are device kernels, what each captures,
//! and its launch extents.
//!
//! A function whose body contains thread-bound loop nests (`for` kind `thread_binding`) runs on
//! two processors: each *outermost* thread-bound nest is a device kernel, and everything else
//! is host code. [`plan_module`] finds the kernels of a module, in the order a walk of each
//! function's body meets them, and says for each one what it captures from the host (buffers
//! and scalar variables, in order of first use) and its launch extents (the `blockIdx.*` and
//! `threadIdx.*` extents, which the host evaluates).
//!
//! The host code generator (LLVM) replaces each nest by a launch of its kernel (found by the
//! nest itself); the device code generator (OpenCL C) emits the nest as that kernel with the
//! same parameters in the same order. Both read the same [`KernelPlan`], so they cannot
//! disagree.

use crate::ir::{Buffer, DataType, Expr, IRModule, PrimFunc, Stmt, StorageScope, Var};

use crate::codegen::{CodegenError, CodegenResult};

/// What one kernel captures: a device buffer or a scalar.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelParam {
    /// A buffer in device memory (a parameter of the host function), passed as its handle.
    Buffer(Buffer),
    /// A scalar variable of the host (a parameter, a shape variable, a host loop or `let`
    /// variable), passed by value.
    Scalar(Var),
}

impl KernelParam {
    /// The parameter's name in the kernel (unique within the kernel).
    pub fn name(&self) -> String {
        match self {
            KernelParam::Buffer(b) => c_name(&b.name, b.data.id.0),
            KernelParam::Scalar(v) => c_name(&v.name, v.id.0),
        }
    }

    /// Its element or value type.
    pub fn dtype(&self) -> DataType {
        match self {
            KernelParam::Buffer(b) => b.dtype,
            KernelParam::Scalar(v) => v.dtype,
        }
    }
}

/// An identifier for generated source: the IR name's letters, digits and `_`, then the id.
pub fn c_name(name: &str, id: u32) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'v');
    }
    format!("{s}_{id}")
}

/// One device kernel: an outermost thread-bound loop nest of a function.
#[derive(Debug, Clone)]
pub struct KernelPlan {
    /// The kernel's symbol: `<function>_kernel<k>`.
    pub name: String,
    /// The function it comes from.
    pub func: String,
    /// The nest (a `for` of kind `thread_binding`).
    pub nest: Stmt,
    /// What it captures, in order.
    pub params: Vec<KernelParam>,
    /// `blockIdx.x|y|z` extents (1 where unbound), evaluated by the host.
    pub grid: [Expr; 3],
    /// `threadIdx.x|y|z` extents (1 where unbound), evaluated by the host.
    pub block: [Expr; 3],
}

/// The kernels of every exported function of `module`, in module order.
///
/// # Errors
/// [`CodegenError::Unsupported`] for a nest the split cannot launch: one that captures a buffer
/// which is not in device memory (a host `local` allocation) or a non-scalar variable.
pub fn plan_module(module: &IRModule) -> CodegenResult<Vec<KernelPlan>> {
    let mut out = Vec::new();
    for f in module.functions.iter().filter(|f| !f.attrs.host) {
        out.extend(plan_function(f)?);
    }
    Ok(out)
}

/// The kernels of one function, in walk order ([`crate::ir::device::kernels`]).
///
/// # Errors
/// As [`plan_module`].
pub fn plan_function(f: &PrimFunc) -> CodegenResult<Vec<KernelPlan>> {
    crate::ir::device::kernels(f)
        .into_iter()
        .enumerate()
        .map(|(k, (_, nest))| plan_nest(f, k, nest))
        .collect()
}

fn plan_nest(f: &PrimFunc, k: usize, nest: &Stmt) -> CodegenResult<KernelPlan> {
    let name = format!("{}_kernel{k}", f.name);
    let err = |what: String| {
        CodegenError::Unsupported(format!("function `{}`, kernel {k}: {what}", f.name))
    };
    let uses = nest.free_uses();
    let mut params = Vec::new();
    for b in &uses.buffers {
        if b.scope != StorageScope::Global && b.scope != StorageScope::Workspace {
            return Err(err(format!(
                "the kernel uses `{}`, a {} allocation of the host; device kernels can use \
                 parameters, workspace allocations and their own shared/local allocations",
                b.name,
                b.scope.name()
            )));
        }
        params.push(KernelParam::Buffer(b.clone()));
    }
    for v in &uses.vars {
        if v.dtype.lanes != 1 || v.dtype.is_handle() {
            return Err(err(format!(
                "the kernel captures `{}` of type {}, expected a scalar",
                v.name, v.dtype
            )));
        }
        params.push(KernelParam::Scalar(v.clone()));
    }
    // Launch extents, one per tag (the verifier makes every loop of a tag agree, and keeps
    // them computable by the host).
    let one = || Expr::from(1i64);
    let mut grid = [one(), one(), one()];
    let mut block = [one(), one(), one()];
    for (tag, extent) in crate::ir::device::launch_extents(nest) {
        let slot = if tag.is_thread() {
            &mut block
        } else {
            &mut grid
        };
        slot[tag.axis()] = extent.clone();
    }
    Ok(KernelPlan {
        name,
        func: f.name.clone(),
        nest: nest.clone(),
        params,
        grid,
        block,
    })
}

/// The bytes a buffer parameter spans: `numel * element size` for a compact buffer, or one past
/// the farthest element for a strided one. The host computes it and the device runtime checks
/// the allocation holds it before a launch.
pub fn span_elements(b: &Buffer) -> Expr {
    use crate::ir::BinOp;
    let i64e = |e: &Expr| {
        if e.dtype() == DataType::i64() {
            e.clone()
        } else {
            Expr::Cast {
                dtype: DataType::i64(),
                value: Box::new(e.clone()),
                saturate: true,
            }
        }
    };
    let bin = |op, a: Expr, b: Expr| Expr::Binary {
        op,
        a: Box::new(a),
        b: Box::new(b),
    };
    match &b.strides {
        None => b
            .shape
            .iter()
            .fold(Expr::from(1i64), |acc, d| bin(BinOp::Mul, acc, i64e(d))),
        Some(strides) => {
            // 1 + sum((extent - 1) * stride); 0 when any extent is 0.
            let mut last = Expr::from(1i64);
            let mut any_zero = Expr::from(false);
            for (d, s) in b.shape.iter().zip(strides) {
                let dm1 = bin(BinOp::Sub, i64e(d), Expr::from(1i64));
                last = bin(BinOp::Add, last, bin(BinOp::Mul, dm1, i64e(s)));
                any_zero = bin(
                    BinOp::Or,
                    any_zero,
                    bin(BinOp::Le, i64e(d), Expr::from(0i64)),
                );
            }
            Expr::Select {
                cond: Box::new(any_zero),
                t: Box::new(Expr::from(0i64)),
                f: Box::new(last),
            }
        }
    }
}
