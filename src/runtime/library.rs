//! Loading shared libraries of packed functions: [`LibraryModule`].
//!
//! A library exports one `__tvm_ffi_<name>` symbol per function (tvm-ffi's module ABI). It needs
//! no `libtvm_ffi`: the runtime services it calls (raising errors, and whatever kiln's code
//! generator adds, such as the parallel launcher) are reached through *context slots*, exported
//! zero-initialized `void*` variables named `__<CFunctionName>` that the loader fills right after
//! `dlopen`. kiln fills every slot registered in [`crate::packed_func::context`]; tvm_ffi and TVM
//! fill theirs the same way, so one library works in all of them.
//!
//! A function taken from a library keeps the library loaded ([`PackedFunc`] holds an `Arc`).

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::device_module::{load_device_module, DeviceModule};
use crate::packed_func::context::context_symbols;
use crate::packed_func::ffi::TVMFFISafeCallType;
use crate::packed_func::{Module, PackedFunc, PackedFuncError};

/// The prefix of exported packed functions.
pub const SYMBOL_PREFIX: &str = "__tvm_ffi_";

/// Errors of loading a library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LibraryError {
    /// The file could not be read or is not an ELF shared object.
    #[error("cannot read `{path}` as a shared library: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// `dlopen` refused the file.
    #[error("cannot load `{path}`: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
}

/// A loaded shared library of packed functions.
pub struct LibraryModule {
    path: PathBuf,
    lib: Arc<Loaded>,
    names: Vec<String>,
}

/// A loaded library and the device module its host code launches kernels through (when it
/// has device code): what its functions keep alive.
struct Loaded {
    lib: libloading::Library,
    device: Option<Arc<DeviceModule>>,
}

impl std::fmt::Debug for LibraryModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibraryModule")
            .field("path", &self.path)
            .field("functions", &self.names)
            .finish()
    }
}

/// The names of the `__tvm_ffi_<name>` functions a shared object defines, from its dynamic
/// symbol table (metadata and doc getters, `__tvm_ffi__*`, are not functions).
pub fn exported_functions(data: &[u8]) -> Result<Vec<String>, String> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let mut names: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| {
            s.name()
                .ok()
                .and_then(|n| n.strip_prefix(SYMBOL_PREFIX))
                .map(str::to_owned)
        })
        .filter(|n| !n.starts_with('_') && !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

impl LibraryModule {
    /// Loads `path` (`RTLD_LAZY | RTLD_LOCAL`, as tvm_ffi does) and fills its context slots.
    ///
    /// # Errors
    /// [`LibraryError`] when the file is not a readable shared object or `dlopen` fails.
    ///
    /// # Safety
    /// Loading runs the library's initializers, and calling its functions runs its code: the
    /// library must be a well-behaved tvm-ffi module (as any `dlopen` user must trust). kiln checks
    /// what it can (that it is an ELF shared object) before opening it.
    pub unsafe fn load(path: impl AsRef<Path>) -> Result<Self, LibraryError> {
        // The services generated code reaches through context slots must be registered first.
        super::init();
        let path = path.as_ref().to_path_buf();
        // dlopen searches the system library path for a name without a `/` (`vadd.so` would
        // not mean the file in the current directory): always open an absolute path.
        let open_path = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        let data = crate::util::read_regular_file(&path).map_err(|e| LibraryError::Read {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let names = exported_functions(&data).map_err(|reason| LibraryError::Read {
            path: path.clone(),
            reason,
        })?;
        // Symbols are bound at load time (`RTLD_NOW`): a library that needs a function this
        // process does not have fails to load with the symbol's name, instead of ending the
        // process the first time the call is made.
        // SAFETY: the caller vouches for the library's initializers (see `# Safety`).
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&open_path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| {
            // libloading keeps dlerror()'s text as the error's source.
            let mut reason = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                reason.push_str(": ");
                reason.push_str(&s.to_string());
                src = s.source();
            }
            LibraryError::Open {
                path: path.clone(),
                reason,
            }
        })?;
        let lib: libloading::Library = lib.into();
        for (slot, addr) in context_symbols() {
            let name = format!("{slot}\0");
            // SAFETY: a context slot is an exported `void*` variable; we only take its address.
            if let Ok(sym) = unsafe { lib.get::<*mut *mut c_void>(name.as_bytes()) } {
                let p: *mut *mut c_void = *sym;
                if !p.is_null() {
                    // SAFETY: the slot is a writable, aligned `void*` in the library's data
                    // segment (the context-slot convention); nothing else runs in it yet.
                    unsafe { p.write(addr as *mut c_void) };
                }
            }
        }
        // Device code: the module its host code launches kernels through.
        // SAFETY: `__kiln_device_meta`, when present, is a NUL-terminated constant string
        // written by kiln's exporter; we only read it.
        let meta = unsafe { lib.get::<*const std::ffi::c_char>(b"__kiln_device_meta\0") }
            .ok()
            .map(|sym| {
                // The symbol's address is the first byte of the string.
                let p: *const std::ffi::c_char = *sym;
                // SAFETY: as above.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            });
        let device = match meta {
            None => None,
            Some(m) => {
                let dm = load_device_module(&m).map_err(|reason| LibraryError::Read {
                    path: path.clone(),
                    reason,
                })?;
                // SAFETY: as for the context slots above: an exported, writable `void*`.
                if let Ok(sym) = unsafe { lib.get::<*mut *mut c_void>(b"__kiln_device_module\0") } {
                    let p: *mut *mut c_void = *sym;
                    if !p.is_null() {
                        // SAFETY: as above; the module outlives the library's functions (`Loaded`).
                        unsafe { p.write(Arc::as_ptr(&dm) as *mut c_void) };
                    }
                }
                Some(dm)
            }
        };
        Ok(Self {
            path,
            lib: Arc::new(Loaded { lib, device }),
            names,
        })
    }

    /// The device module its host code launches kernels through, if it has device code.
    pub fn device(&self) -> Option<&Arc<DeviceModule>> {
        self.lib.device.as_ref()
    }

    /// The file this module was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Module for LibraryModule {
    fn type_key(&self) -> &str {
        "library"
    }

    fn get_function(&self, name: &str) -> Option<PackedFunc> {
        let sym = format!("{SYMBOL_PREFIX}{name}\0");
        // SAFETY: `__tvm_ffi_<name>` symbols are safe-call functions by the module ABI, which the
        // loader's caller vouched for in `load`.
        let f: TVMFFISafeCallType = unsafe {
            *self
                .lib
                .lib
                .get::<TVMFFISafeCallType>(sym.as_bytes())
                .ok()?
        };
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.lib.clone();
        // SAFETY: the function stays valid while the library lives, which `keep` ensures; DSO
        // functions take a NULL `self`.
        Some(unsafe { PackedFunc::from_safe_call(name, f, std::ptr::null_mut(), Some(keep)) })
    }

    fn function_names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn get_source(&self, format: &str) -> Option<String> {
        let d = self.lib.device.as_ref()?;
        d.answers(format).then(|| d.source().to_owned())
    }
}

impl From<LibraryError> for PackedFuncError {
    fn from(e: LibraryError) -> Self {
        PackedFuncError::Raised {
            kind: "RuntimeError".into(),
            message: e.to_string(),
        }
    }
}
