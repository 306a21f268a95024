//! Buffers, functions (`PrimFunc`) and modules (`IRModule`).

use super::dtype::DataType;
use super::error::IrResult;
use super::expr::{Expr, Var};
use super::stmt::Stmt;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageScope {
    /// Memory owned by the caller: function parameters.
    Global,
    /// A small temporary private to the enclosing scope (stack or registers).
    Local,
    /// A temporary obtained from the device workspace pool (`TVMBackendAllocWorkspace`).
    Workspace,
    /// Work-group memory of a device kernel, one copy per block, shared by its threads
    /// (OpenCL `__local`, CUDA `__shared__`).
    Shared,
}

impl StorageScope {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            StorageScope::Global => "global",
            StorageScope::Local => "local",
            StorageScope::Workspace => "workspace",
            StorageScope::Shared => "shared",
        }
    }
    /// The scope with this JSON name.
    pub fn from_name(s: &str) -> Option<StorageScope> {
        [
            StorageScope::Global,
            StorageScope::Local,
            StorageScope::Workspace,
            StorageScope::Shared,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// A multi-dimensional array of one element type.
///
/// Element `(i0, .., ik)` lives at element offset `sum(i_d * stride_d)` from `data`, where the
/// strides are `strides` if given and the compact row-major strides of `shape` otherwise.
/// Buffers are identified by their `data` variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    /// Name (unique within a function).
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Extents: integer constants ([`Expr::IntImm`]) or variables ([`Expr::Var`]) of `int32`/`int64`.
    pub shape: Vec<Expr>,
    /// Element strides, same forms as `shape`; `None` means compact row-major.
    pub strides: Option<Vec<Expr>>,
    /// The data pointer (a `handle` variable).
    pub data: Var,
    /// Where it lives.
    pub scope: StorageScope,
}

impl Buffer {
    /// A compact buffer in global scope (a parameter) with a fresh data variable.
    pub fn new(name: &str, dtype: DataType, shape: Vec<Expr>) -> Buffer {
        Buffer {
            name: name.to_string(),
            dtype,
            shape,
            strides: None,
            data: Var::new(name, DataType::handle()),
            scope: StorageScope::Global,
        }
    }

    /// The same buffer with another scope.
    pub fn with_scope(mut self, scope: StorageScope) -> Buffer {
        self.scope = scope;
        self
    }

    /// The same buffer with explicit strides.
    pub fn with_strides(mut self, strides: Vec<Expr>) -> Buffer {
        self.strides = Some(strides);
        self
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements if the shape is constant.
    pub fn const_numel(&self) -> Option<i64> {
        self.shape
            .iter()
            .try_fold(1i64, |acc, e| acc.checked_mul(e.as_int()?))
    }
}

/// A function parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// A tensor (DLTensor at the ABI). Its shape and stride variables are bound by the first
    /// parameter in which they appear; later appearances must agree (checked by the caller).
    Buffer(Buffer),
    /// A scalar (bool, integer or float).
    Scalar(Var),
}

impl Param {
    /// The parameter's name.
    pub fn name(&self) -> &str {
        match self {
            Param::Buffer(b) => &b.name,
            Param::Scalar(v) => &v.name,
        }
    }
}

/// Function attributes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FuncAttrs {
    /// The exported symbol (`__tvm_ffi_<global_symbol>`); `None` for an internal function.
    pub global_symbol: Option<String>,
    /// Buffer parameters never alias each other (LLVM `noalias`; TVM's `tir.noalias`).
    pub noalias: bool,
    /// This is the module's entry function (`__tvm_ffi_main`).
    pub entry: bool,
    /// The function runs on the host even in a device target's module (TVM's
    /// `tir.is_host_func`, e.g. Relax's shape functions): its buffers are host memory, it gets
    /// no kernels, and it takes host tensors. No effect on a CPU target.
    pub host: bool,
}

/// A low-level function over buffers: TVM's `PrimFunc`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrimFunc {
    /// Name within the module.
    pub name: String,
    /// Parameters, in call order.
    pub params: Vec<Param>,
    /// The body.
    pub body: Stmt,
    /// Type of the scalar returned by `return`, or `None` (returns nothing).
    pub ret_type: Option<DataType>,
    /// Attributes.
    pub attrs: FuncAttrs,
}

impl PrimFunc {
    /// A function with `global_symbol = name`, no return value and `noalias = false`.
    pub fn new(name: &str, params: Vec<Param>, body: Stmt) -> PrimFunc {
        PrimFunc {
            name: name.to_string(),
            params,
            body,
            ret_type: None,
            attrs: FuncAttrs {
                global_symbol: Some(name.to_string()),
                noalias: false,
                entry: false,
                host: false,
            },
        }
    }

    /// Sets `noalias`.
    pub fn with_noalias(mut self, noalias: bool) -> PrimFunc {
        self.attrs.noalias = noalias;
        self
    }

    /// Sets the return type.
    pub fn with_ret_type(mut self, ret: DataType) -> PrimFunc {
        self.ret_type = Some(ret);
        self
    }

    /// The signature in TVM's packed-function error messages (MakePackedAPI):
    /// `add(a: Tensor([16], float32), B: Tensor([n], float32), x: int32, flag: bool)`, named by
    /// the global symbol (or the function name if there is none).
    pub fn signature(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| match p {
                Param::Scalar(v) => format!("{}: {}", v.name, v.dtype),
                Param::Buffer(b) => {
                    let dims: Vec<String> = b
                        .shape
                        .iter()
                        .map(|d| match d {
                            Expr::IntImm { value, .. } => value.to_string(),
                            Expr::Var(v) => v.name.to_string(),
                            other => other.to_string(),
                        })
                        .collect();
                    format!("{}: Tensor([{}], {})", b.name, dims.join(", "), b.dtype)
                }
            })
            .collect();
        let name = self.attrs.global_symbol.as_deref().unwrap_or(&self.name);
        format!("{name}({})", params.join(", "))
    }

    /// Verifies this function alone (see [`super::verify`]).
    ///
    /// # Errors
    /// The first problem found, with its node path.
    pub fn verify(&self) -> IrResult<()> {
        super::verify::verify_func(self)
    }
}

/// A set of named functions: the unit that is read, verified and compiled.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IRModule {
    /// Functions in order; names are unique (checked by the verifier).
    pub functions: Vec<PrimFunc>,
}

impl IRModule {
    /// An empty module.
    pub fn new() -> IRModule {
        IRModule::default()
    }

    /// A module of these functions.
    pub fn from_functions(functions: Vec<PrimFunc>) -> IRModule {
        IRModule { functions }
    }

    /// Adds a function.
    pub fn add(&mut self, func: PrimFunc) {
        self.functions.push(func);
    }

    /// The function named `name`.
    pub fn get(&self, name: &str) -> Option<&PrimFunc> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Reads the `kiln-ir/1` JSON format (see `docs/ir.md`). The result is not yet verified.
    ///
    /// # Errors
    /// [`super::IrError::Syntax`] for bad JSON or nesting deeper than 128 levels,
    /// [`super::IrError::Json`] (with the JSON path) for anything not in the schema.
    pub fn from_json_str(text: &str) -> IrResult<IRModule> {
        super::json::module_from_str(text)
    }

    /// Reads the format from a parsed JSON value.
    ///
    /// # Errors
    /// As [`IRModule::from_json_str`].
    pub fn from_json(value: &serde_json::Value) -> IrResult<IRModule> {
        super::json::module_from_value(value)
    }

    /// Writes the `kiln-ir/1` JSON format.
    pub fn to_json(&self) -> serde_json::Value {
        super::json::module_to_value(self)
    }

    /// Writes the JSON format as pretty-printed text.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.to_json()).unwrap_or_default()
    }

    /// Verifies every function and the module (unique names).
    ///
    /// # Errors
    /// The first error; [`IRModule::verify_all`] returns all of them.
    pub fn verify(&self) -> IrResult<()> {
        match self.verify_all().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every verifier error, in node order (empty when the module is well formed).
    pub fn verify_all(&self) -> Vec<super::IrError> {
        super::verify::verify_module(self)
    }
}
