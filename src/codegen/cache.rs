//! The compile cache: a content hash of (IR, resolved code generation options, kiln version,
//! LLVM version) names a shared library in a cache directory, so building the same module again
//! costs a file lookup and a `dlopen` instead of a compilation.
//!
//! - Location: `KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `$HOME/.cache/kiln`.
//! - `KILN_CACHE=off` (or `0`) disables it for [`crate::codegen::build`].
//! - Entries are written to a temporary file and renamed into place, so a reader never sees a
//!   partial library, and concurrent writers of the same key are harmless.
//! - On a miss, `target.build.llvm` JIT-compiles as usual (the fast path for the first build) and
//!   fills the cache in a background thread; one background compilation runs at a time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::llvm::{export, CodegenOptions};
use super::{CodegenError, CodegenResult, ModuleRef};
use crate::ir::IRModule;
use crate::packed_func::{Module, PackedFunc};
use crate::runtime::LibraryModule;

/// A directory of compiled libraries keyed by content hash.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

/// A module served from the cache: the library, plus what it was built from (for `get_source`).
pub struct CachedModule {
    lib: LibraryModule,
    ir: IRModule,
    opts: CodegenOptions,
}

impl Module for CachedModule {
    fn type_key(&self) -> &str {
        "llvm"
    }
    fn get_function(&self, name: &str) -> Option<PackedFunc> {
        self.lib.get_function(name)
    }
    fn function_names(&self) -> Vec<String> {
        self.lib.function_names()
    }
    fn get_source(&self, format: &str) -> Option<String> {
        super::llvm::LlvmModule::jit(&self.ir, &self.opts)
            .ok()?
            .get_source(format)
    }
}

/// The file holding kiln's code in this process: the shared library kiln is linked into
/// (`libkiln_python.so` in Python) or else the executable. Found by the mapping of this
/// function's own address in `/proc/self/maps`; the executable where that is not readable.
fn code_file() -> Option<std::path::PathBuf> {
    let here = code_file as fn() -> Option<std::path::PathBuf> as usize;
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| mapped_file(&maps, here))
        .or_else(|| std::env::current_exe().ok())
}

/// The file mapped at `addr` in a `/proc/<pid>/maps` text (`lo-hi perms offset dev inode
/// path` per line), if it is a file.
fn mapped_file(maps: &str, addr: usize) -> Option<std::path::PathBuf> {
    maps.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let (lo, hi) = parts.next()?.split_once('-')?;
        let lo = usize::from_str_radix(lo, 16).ok()?;
        let hi = usize::from_str_radix(hi, 16).ok()?;
        let path = parts.nth(4)?;
        (lo <= addr && addr < hi && path.starts_with('/')).then(|| path.into())
    })
}

fn build_identity() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let exe = code_file();
        let meta = exe.as_ref().and_then(|e| std::fs::metadata(e).ok());
        let mtime = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        format!("{exe:?}|{:?}|{mtime:?}", meta.map(|m| m.len()))
    })
    .clone()
}

impl CompileCache {
    /// A cache in `dir` (created on first store).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    /// The cache the environment asks for, or `None` when `KILN_CACHE` is `off`/`0` or no
    /// location can be found.
    pub fn from_env() -> Option<Self> {
        if matches!(
            std::env::var("KILN_CACHE").as_deref(),
            Ok("off" | "0" | "false")
        ) {
            return None;
        }
        let dir = std::env::var_os("KILN_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("kiln")))
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kiln"))
            })?;
        Some(Self::at(dir))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of `module` compiled with `opts`.
    ///
    /// The key holds the *resolved* CPU and features ([`CodegenOptions::resolved`]): `native`
    /// is expanded to this machine's CPU first, so a cache directory shared between machines
    /// never serves one machine the code compiled for another's CPU, and `native` shares its
    /// entries with the same CPU named explicitly.
    pub fn key(module: &IRModule, opts: &CodegenOptions) -> String {
        let opts = &opts.clone().resolved();
        let mut h = blake3::Hasher::new();
        h.update(b"kiln-cache/1\0");
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.update(b"\0llvm-14\0");
        // The crate version does not change between development builds: the identity (path,
        // size, modification time) of the file holding kiln's code does, the executable or
        // the library kiln is linked into (a Python process's executable is Python's), so a
        // rebuilt kiln never reuses entries compiled by an older code generator.
        h.update(build_identity().as_bytes());
        h.update(module.to_json().to_string().as_bytes());
        for part in [
            &opts.triple,
            &opts.cpu,
            &opts.features,
            &opts.fast_math,
            &opts.device_name,
        ] {
            h.update(b"\0");
            h.update(part.as_bytes());
        }
        h.update(&opts.opt_level.to_le_bytes());
        h.update(&opts.device_type.to_le_bytes());
        // Every other option that changes the code: the streaming-store threshold (from the
        // host's caches, or set by the caller), the device host code and its metadata.
        h.update(&[u8::from(opts.device_host)]);
        for part in [
            opts.stream_store_bytes.map(|b| b.to_string()),
            opts.device_meta.clone(),
        ] {
            h.update(b"\0");
            match part {
                Some(p) => {
                    h.update(b"1");
                    h.update(p.as_bytes());
                }
                None => {
                    h.update(b"0");
                }
            }
        }
        h.finalize().to_hex()[..32].to_owned()
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.so"))
    }

    /// The cached module for `key`, if present and loadable.
    pub fn lookup(&self, key: &str, module: &IRModule, opts: &CodegenOptions) -> Option<ModuleRef> {
        let p = self.path(key);
        if !p.is_file() {
            return None;
        }
        // SAFETY: the file is a library kiln compiled into its own cache directory.
        match unsafe { LibraryModule::load(&p) } {
            Ok(lib) => Some(Arc::new(CachedModule {
                lib,
                ir: module.clone(),
                opts: opts.clone(),
            })),
            Err(e) => {
                log::warn!(
                    "compile cache: ignoring unloadable entry {}: {e}",
                    p.display()
                );
                None
            }
        }
    }

    /// Compiles `module` into the cache (synchronously) and returns the library's path.
    ///
    /// # Errors
    /// Compilation, linking or file-system errors.
    pub fn store(
        &self,
        key: &str,
        module: &IRModule,
        opts: &CodegenOptions,
    ) -> CodegenResult<PathBuf> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            CodegenError::Io(format!(
                "creating the cache directory `{}`: {e}",
                self.dir.display()
            ))
        })?;
        let tmp = self
            .dir
            .join(format!(".{key}.{}.tmp.so", std::process::id()));
        export(module, opts, &tmp)?;
        let dst = self.path(key);
        std::fs::rename(&tmp, &dst).map_err(|e| {
            CodegenError::Io(format!(
                "renaming `{}` to `{}`: {e}",
                tmp.display(),
                dst.display()
            ))
        })?;
        Ok(dst)
    }

    /// Fills the cache entry in a background thread unless another one is running.
    pub fn store_in_background(&self, key: String, module: IRModule, opts: CodegenOptions) {
        static BUSY: AtomicBool = AtomicBool::new(false);
        if BUSY.swap(true, Ordering::AcqRel) {
            return;
        }
        let cache = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kiln-cache".into())
            .spawn(move || {
                if let Err(e) = cache.store(&key, &module, &opts) {
                    log::warn!("compile cache: could not store {key}: {e}");
                }
                BUSY.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            BUSY.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn the_mapping_holding_an_address_names_its_file() {
        let maps = "55d0-55e0 r-xp 00000000 08:01 12 /usr/bin/python3.11\n\
                    7f00-7f80 r-xp 00001000 08:01 34 /opt/kiln/lib/libkiln_python.so\n\
                    7f80-7f90 rw-p 00000000 00:00 0 [heap]\n";
        assert_eq!(
            mapped_file(maps, 0x7f10),
            Some("/opt/kiln/lib/libkiln_python.so".into())
        );
        assert_eq!(
            mapped_file(maps, 0x55d0),
            Some("/usr/bin/python3.11".into())
        );
        assert_eq!(
            mapped_file(maps, 0x7f85),
            None,
            "an anonymous mapping is no file"
        );
        assert_eq!(mapped_file(maps, 0x1), None);
        assert_eq!(mapped_file("garbage\n12-zz r 0 0 0 /x\n", 0x12), None);
    }

    #[test]
    fn this_code_is_found_in_this_process() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let here = code_file as fn() -> Option<std::path::PathBuf> as usize;
        // A test binary links kiln statically: its code is in the executable.
        assert_eq!(mapped_file(&maps, here), std::env::current_exe().ok());
    }
}
