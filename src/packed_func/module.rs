//! The [`Module`] trait: a named collection of packed functions, as TVM's `runtime.Module`.

use super::error::{PackedFuncError, PackedFuncResult};
use super::function::PackedFunc;

/// A runtime module: functions by name. Implemented by JIT modules, loaded libraries and any
/// user backend's module.
pub trait Module: Send + Sync {
    /// What kind of module this is (`"llvm"`, `"library"`, ...).
    fn type_key(&self) -> &str;

    /// The function `name`, if the module has it.
    fn get_function(&self, name: &str) -> Option<PackedFunc>;

    /// The names of the functions the module exports, sorted.
    fn function_names(&self) -> Vec<String>;

    /// Source in a format such as `"ll"` or `"asm"`, if the module keeps it.
    fn get_source(&self, format: &str) -> Option<String> {
        let _ = format;
        None
    }

    /// The function `name`.
    ///
    /// # Errors
    /// [`PackedFuncError::NoSuchFunction`] listing the functions the module has.
    fn require_function(&self, name: &str) -> PackedFuncResult<PackedFunc> {
        self.get_function(name)
            .ok_or_else(|| PackedFuncError::NoSuchFunction {
                module: self.type_key().to_owned(),
                name: name.to_owned(),
                available: self.function_names(),
            })
    }
}
