//! Loading plugins: the checks of a file before it is opened and of its table after, the calls
//! that bring its devices up, the registration of the backend and its kernels, directory scans
//! (`KILN_PLUGIN_PATH`), and the errors of all that ([`PluginError`]). A concern of plugins only,
//! so it has its own file beside the backend's `mod.rs` / `memory.rs` / `stream.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::allocator::{ChunkAllocator, ChunkConfig};
use super::memory::Source;
use super::sys::{self, call_opt, call_req, RawPlugin, KILN_STATUS_SUCCESS};
use super::{
    PluginDeviceApi, PluginInfo, DEFAULT_STAGING_CHUNK, MAX_PLUGIN_DEVICES, PINNED_STAGING_VAR,
    PLUGIN_PATH_VAR,
};
use crate::device_api::api::DeviceApi;
use crate::device_api::device::DeviceType;
use crate::device_api::error::DeviceError;
use crate::device_api::stream::HandleTable;
use crate::util::lock;

/// Errors of loading a plugin. Each names the file and says what is wrong, with the plugin's
/// own message when it gave one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The file is missing, unreadable, or not a shared library.
    #[error("`{path}` is not a device plugin: {reason}")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A shared library without the entry symbol `kiln_device_plugin_init`.
    #[error("`{path}` is not a device plugin: it does not export `kiln_device_plugin_init`{}", detail(.reason))]
    NoEntry {
        /// The file.
        path: PathBuf,
        /// The loader's message, if any.
        reason: String,
    },
    /// `dlopen` refused the file.
    #[error("cannot load device plugin `{path}`: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The entry symbol returned an error.
    #[error(
        "device plugin `{path}`: kiln_device_plugin_init failed with status {status}: {message}"
    )]
    EntryFailed {
        /// The file.
        path: PathBuf,
        /// The status, with its name.
        status: String,
        /// The plugin's message.
        message: String,
    },
    /// The entry filled the parameters incorrectly (no name, no table, a bad name).
    #[error("device plugin `{path}`: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An ABI version (or table size) kiln does not support.
    #[error(
        "device plugin `{device_type}` ({path}) was built for device plugin ABI {}.{}; this kiln \
         supports {}.0 to {}.{}: {reason}",
        .plugin.0, .plugin.1, sys::KILN_PLUGIN_ABI_MAJOR, sys::KILN_PLUGIN_ABI_MAJOR,
        sys::KILN_PLUGIN_ABI_MINOR
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The plugin's ABI version (major, minor).
        plugin: (u32, u32),
        /// What is wrong and what to do.
        reason: String,
    },
    /// Required entries are NULL.
    #[error("device plugin `{device_type}` ({path}) lacks required entries: {}", .missing.join(", "))]
    MissingEntries {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The missing entries.
        missing: Vec<String>,
    },
    /// `initialize`, `init_device` or another call made while loading failed.
    #[error("device plugin `{device_type}` ({path}): {step} failed: {message}")]
    InitFailed {
        /// The file.
        path: PathBuf,
        /// The plugin's device type name.
        device_type: String,
        /// The call that failed (`initialize`, `init_device(1)`, ...).
        step: String,
        /// The plugin's message.
        message: String,
    },
    /// The backend could not be registered (a name already taken, a bad name).
    #[error("device plugin `{path}`: {source}")]
    Registration {
        /// The file.
        path: PathBuf,
        /// The registry's error.
        source: DeviceError,
    },
}

fn detail(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

struct Loaded {
    path: PathBuf,
    api: Arc<PluginDeviceApi>,
}

fn loaded() -> &'static Mutex<Vec<Loaded>> {
    static LOADED: OnceLock<Mutex<Vec<Loaded>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// The plugins loaded in this process, in load order.
pub fn loaded_plugins() -> Vec<Arc<PluginDeviceApi>> {
    lock(loaded()).iter().map(|l| l.api.clone()).collect()
}

/// Loads the device plugin at `path` and registers it (see the module docs). Loading the same
/// file again returns the plugin loaded first.
///
/// Loading a plugin runs its code in this process, as any plugin host does: kiln checks what it
/// can before (that the file is a shared library defining `kiln_device_plugin_init`) and after
/// (sizes, versions, required entries), but a plugin that corrupts memory cannot be contained.
///
/// # Errors
/// [`PluginError`]: not a library, no entry, a failing entry, a version kiln does not support,
/// missing required entries, a failing `initialize`/`init_device`, a name already registered.
pub fn load_plugin(path: impl AsRef<Path>) -> Result<Arc<PluginDeviceApi>, PluginError> {
    let path = path.as_ref();
    crate::device_api::init();
    let canon = std::fs::canonicalize(path).map_err(|e| PluginError::NotALibrary {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut all = lock(loaded());
    if let Some(l) = all.iter().find(|l| l.path == canon) {
        return Ok(l.api.clone());
    }
    let api = Arc::new(open_plugin(&canon)?);
    register(&api)?;
    all.push(Loaded {
        path: canon,
        api: api.clone(),
    });
    Ok(api)
}

fn open_plugin(path: &Path) -> Result<PluginDeviceApi, PluginError> {
    let p = path.to_path_buf();
    let data = crate::util::read_regular_file(path).map_err(|e| PluginError::NotALibrary {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    match sys::defines_entry(&data) {
        Err(reason) => return Err(PluginError::NotALibrary { path: p, reason }),
        Ok(false) => {
            return Err(PluginError::NoEntry {
                path: p,
                reason: String::new(),
            })
        }
        Ok(true) => {}
    }
    drop(data);
    let (raw, entry) = RawPlugin::open(path)?;
    let name = entry.device_type.clone();
    let init_failed = |step: String, message: String| PluginError::InitFailed {
        path: p.clone(),
        device_type: name.clone(),
        step,
        message,
    };
    let msg = |raw: &RawPlugin| {
        raw.last_error()
            .unwrap_or_else(|| "the plugin gave no message".to_owned())
    };
    if let Some(s) = call_opt!(raw, initialize()) {
        if s != KILN_STATUS_SUCCESS {
            return Err(init_failed(format!("initialize (status {s})"), msg(&raw)));
        }
    }
    let mut count = 0usize;
    let s = call_req!(raw, get_device_count(&mut count));
    if s != KILN_STATUS_SUCCESS {
        let m = msg(&raw);
        let _ = call_opt!(raw, finalize());
        return Err(init_failed(format!("get_device_count (status {s})"), m));
    }
    if count > MAX_PLUGIN_DEVICES {
        let _ = call_opt!(raw, finalize());
        return Err(PluginError::Invalid {
            path: p.clone(),
            reason: format!(
                "get_device_count reported {count} devices; kiln accepts at most \
                 {MAX_PLUGIN_DEVICES}"
            ),
        });
    }
    for id in 0..count as i32 {
        if let Some(s) = call_opt!(raw, init_device(id)) {
            if s != KILN_STATUS_SUCCESS {
                let m = msg(&raw);
                for j in 0..id {
                    let _ = call_opt!(raw, deinit_device(j));
                }
                let _ = call_opt!(raw, finalize());
                return Err(init_failed(format!("init_device({id}) (status {s})"), m));
            }
        }
    }
    let device_list = if count > 0 && raw.table().get_device_list.is_some() {
        let mut ids = vec![0usize; count];
        match call_opt!(raw, get_device_list(ids.as_mut_ptr())) {
            Some(KILN_STATUS_SUCCESS) => {
                if let Err(reason) = check_device_list(&ids) {
                    for j in 0..count as i32 {
                        let _ = call_opt!(raw, deinit_device(j));
                    }
                    let _ = call_opt!(raw, finalize());
                    return Err(PluginError::Invalid { path: p, reason });
                }
                ids
            }
            _ => (0..count).collect(),
        }
    } else {
        (0..count).collect()
    };
    let mut api = PluginDeviceApi {
        info: PluginInfo {
            name: entry.device_type,
            sub_device_type: entry.sub_device_type,
            path: p.clone(),
            plugin_version: entry.plugin_version,
            abi: entry.abi,
            table_size: entry.table_size,
            code: DeviceType(0),
            device_count: count,
            device_list,
            absent_entries: sys::absent_optional_entries(raw.table()),
            kernels: Vec::new(),
            chunk_config: None,
        },
        raw,
        allocators: Vec::new(),
        unified: Mutex::new(BTreeMap::new()),
        streams: Mutex::new(HandleTable::new()),
        events: Mutex::new(HandleTable::new()),
        default_streams: Mutex::new(vec![None; count]),
        staging: Mutex::new(vec![None; count]),
        pinned_staging: AtomicBool::new(false),
        staging_chunk: AtomicUsize::new(DEFAULT_STAGING_CHUNK),
        staging_counts: Default::default(),
        code: AtomicI32::new(0),
        kernels: Mutex::new(Vec::new()),
    };
    let wants = count > 0 && {
        let mut v = sys::attr_value();
        call_opt!(
            api.raw,
            get_attribute(0, sys::KILN_ATTR_KIND_PINNED_STAGING, &mut v)
        ) == Some(KILN_STATUS_SUCCESS)
            && v.type_ == sys::KILN_ATTR_INT
            && v.int_value != 0
    };
    let on = match std::env::var(PINNED_STAGING_VAR).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => wants,
    };
    api.pinned_staging.store(on, Ordering::Relaxed);
    let configs: Vec<ChunkConfig> = (0..count as i32).map(|i| api.query_config(i)).collect();
    api.info.chunk_config = configs.first().copied();
    api.allocators = configs
        .into_iter()
        .map(|c| Mutex::new(ChunkAllocator::new(c)))
        .collect();
    for id in 0..count as i32 {
        let r = lock(&api.allocators[id as usize]).preallocate(&mut Source { api: &api, dev: id });
        if let Err(m) = r {
            // `api` drops here: its Drop returns what was allocated and finalizes.
            return Err(init_failed(
                format!("the initial allocation on device {id}"),
                m,
            ));
        }
    }
    Ok(api)
}

/// The ids of `get_device_list`: distinct and usable as kiln device ids (below 2^31).
fn check_device_list(ids: &[usize]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, &id) in ids.iter().enumerate() {
        if i32::try_from(id).is_err() {
            return Err(format!(
                "get_device_list gave device id {id} at position {i}; expected ids below {}",
                i32::MAX as u64 + 1
            ));
        }
        if !seen.insert(id) {
            return Err(format!(
                "get_device_list gave device id {id} twice (again at position {i}); expected \
                 distinct ids"
            ));
        }
    }
    Ok(())
}

fn register(api: &Arc<PluginDeviceApi>) -> Result<(), PluginError> {
    let path = api.info.path.clone();
    let name = api.info.name.clone();
    let prefix = format!("{name}.");
    let kernels = api
        .raw
        .kernels(&prefix)
        .map_err(|(s, m)| PluginError::InitFailed {
            path: path.clone(),
            device_type: name.clone(),
            step: format!("get_kernels (status {s})"),
            message: m,
        })?;
    if let Some((k, _)) = kernels
        .iter()
        .find(|(k, _)| crate::packed_func::registry::get(k).is_some())
    {
        return Err(PluginError::Registration {
            path,
            source: DeviceError::Registration {
                name,
                code: 0,
                reason: format!(
                    "the global function `{k}` (a plugin kernel) is already registered"
                ),
            },
        });
    }
    // The code is chosen first and may be taken by a concurrent registration: retry then.
    let mut attempts = 0;
    loop {
        let code = crate::device_api::registry::next_extension_code().map_err(|source| {
            PluginError::Registration {
                path: path.clone(),
                source,
            }
        })?;
        // `device_type()` must report the code when the registry checks it.
        api.code.store(code.0, Ordering::SeqCst);
        let dyn_api: Arc<dyn DeviceApi> = api.clone();
        match crate::device_api::registry::register_device_api(&name, code, dyn_api) {
            Ok(()) => break,
            Err(source) => {
                let list = crate::device_api::registry::list();
                let lost_race = list.iter().any(|(n, c)| *c == code && *n != name)
                    && !list.iter().any(|(n, _)| *n == name);
                attempts += 1;
                if !lost_race || attempts >= 8 {
                    api.code.store(0, Ordering::SeqCst);
                    return Err(PluginError::Registration { path, source });
                }
            }
        }
    }
    let mut names = Vec::new();
    for (k, f) in kernels {
        match crate::packed_func::registry::register(&k, f, false) {
            Ok(()) => names.push(k),
            Err(e) => log::warn!("plugin `{name}`: registering kernel `{k}`: {e}"),
        }
    }
    *lock(&api.kernels) = names;
    Ok(())
}

/// The outcome of loading every plugin in some directories.
#[derive(Debug, Default)]
pub struct PluginScan {
    /// The plugins loaded (or found loaded already).
    pub loaded: Vec<Arc<PluginDeviceApi>>,
    /// The files (or directories) that failed, with why. They were skipped.
    pub failed: Vec<(PathBuf, PluginError)>,
    /// Entries skipped without trying to load them (broken symbolic links), with why. Each is
    /// also logged as a warning.
    pub skipped: Vec<(PathBuf, String)>,
}

fn is_library_name(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".so") || name.contains(".so.") || name.ends_with(".dylib")
}

/// Loads every shared library (`*.so`, `*.so.*`, `*.dylib`) in each of `dirs`, in name order.
/// An entry of `dirs` that is a file (not a directory) is loaded as a plugin itself, whatever its
/// name. Bad files are reported in [`PluginScan::failed`] and skipped; broken symbolic links
/// with a library name are logged and listed in [`PluginScan::skipped`]; other files are
/// ignored.
pub fn load_plugins_from_dirs<I, P>(dirs: I) -> PluginScan
where
    I: IntoIterator<Item = P>,
    P: AsRef<Path>,
{
    let mut scan = PluginScan::default();
    for dir in dirs {
        let dir = dir.as_ref();
        let fail = |reason: String| {
            (
                dir.to_path_buf(),
                PluginError::NotALibrary {
                    path: dir.to_path_buf(),
                    reason,
                },
            )
        };
        match std::fs::metadata(dir) {
            Err(e) => {
                scan.failed.push(fail(format!(
                    "cannot read the plugin directory or file (expected a directory of plugins \
                     or a plugin file): {e}"
                )));
                continue;
            }
            Ok(m) if !m.is_dir() => {
                match load_plugin(dir) {
                    Ok(api) => scan.loaded.push(api),
                    Err(e) => scan.failed.push((dir.to_path_buf(), e)),
                }
                continue;
            }
            Ok(_) => {}
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                scan.failed
                    .push(fail(format!("cannot read the plugin directory: {e}")));
                continue;
            }
        };
        let mut files: Vec<PathBuf> = Vec::new();
        for p in entries.filter_map(Result::ok).map(|e| e.path()) {
            if !is_library_name(&p) {
                continue;
            }
            let is_link = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => files.push(p),
                Ok(_) => {}
                Err(e) if is_link => {
                    let target = std::fs::read_link(&p)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".to_owned());
                    let why = format!("a broken symbolic link to `{target}`: {e}");
                    log::warn!("skipping plugin `{}`: {why}", p.display());
                    scan.skipped.push((p, why));
                }
                Err(e) => scan.failed.push((
                    p.clone(),
                    PluginError::NotALibrary {
                        path: p,
                        reason: e.to_string(),
                    },
                )),
            }
        }
        files.sort();
        for f in files {
            match load_plugin(&f) {
                Ok(api) => scan.loaded.push(api),
                Err(e) => scan.failed.push((f, e)),
            }
        }
    }
    scan
}

/// Loads every plugin in the directories (or plugin files) of `KILN_PLUGIN_PATH`
/// (`:`-separated); nothing when it is unset or empty. See [`load_plugins_from_dirs`].
pub fn load_plugins_from_env() -> PluginScan {
    match std::env::var_os(PLUGIN_PATH_VAR) {
        Some(v) if !v.is_empty() => {
            load_plugins_from_dirs(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()))
        }
        _ => PluginScan::default(),
    }
}
