//! The thread pool behind parallel loops: `TVMBackendParallelLaunch` with TVM's C signature.
//!
//! Generated code outlines the body of a parallel loop into a *lambda*
//! `int lambda(int task_id, TVMParallelGroupEnv* env, void* cdata)` that handles its share of the
//! iterations for `env->num_task` tasks, and calls the launcher through the context slot
//! `__TVMBackendParallelLaunch` (kiln fills it when it loads a library or builds a JIT module; a
//! TVM runtime fills it with its own pool; where nothing fills it, the generated code runs the
//! lambda serially).
//!
//! # Design
//!
//! Latency matters more than throughput here: kernels of a few microseconds are called from
//! foreign threads (Python, C), where a general-purpose pool's cross-thread wake-up (10-20 us for
//! rayon, measured) costs more than the work. So, as TVM's and XNNPACK's pools do:
//! - persistent workers, `KILN_NUM_THREADS` of them in all (default: the physical cores), the
//!   caller being one of them: it runs tasks too;
//! - a launch that leaves the task count to the pool (generated code does) gets
//!   [`TASKS_PER_THREAD`] tasks per thread, claimed dynamically, so a thread that another process
//!   delays does not hold up the launch;
//! - workers spin on a generation counter for a bounded time (`KILN_THREAD_POOL_SPIN`
//!   iterations, default 100000, 0 = park at once), then park on a condition variable;
//! - tasks are claimed from a counter tagged with the launch generation, so a worker that wakes
//!   late can never run a task of the next launch with the previous lambda;
//! - a launch from inside a running task (nested parallel loops), or with one thread, runs
//!   serially on the calling thread instead of deadlocking;
//! - the first failing task's raised error is carried to the launching thread and raised there.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use crate::packed_func::ffi;

/// `TVMParallelGroupEnv`: what a parallel lambda learns about its launch.
#[repr(C)]
#[derive(Debug)]
pub struct TVMParallelGroupEnv {
    /// Reserved for barriers (NULL: kiln emits no barriers).
    pub sync_handle: *mut c_void,
    /// The number of tasks of this launch.
    pub num_task: i32,
}

/// `FTVMParallelLambda`.
pub type ParallelLambda = unsafe extern "C" fn(i32, *mut TVMParallelGroupEnv, *mut c_void) -> i32;

thread_local! {
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

#[derive(Clone, Copy)]
struct Job {
    lambda: ParallelLambda,
    cdata: usize,
    num_task: i32,
    generation: u32,
}

struct Shared {
    /// Bumped once per launch; workers wait for it to change.
    generation: AtomicU64,
    /// The current launch's parameters (read by a worker once per launch).
    job: Mutex<Option<Job>>,
    /// `generation << 32 | next task index`.
    cursor: AtomicU64,
    /// Tasks of the current launch that have finished.
    done: AtomicI32,
    /// The first failure of the current launch: (code, kind, message).
    error: Mutex<Option<(i32, String, String)>>,
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    spin: u32,
}

/// Tasks per thread of a launch that leaves the count to the pool (`num_task <= 0`, what kiln's
/// generated code asks for).
pub const TASKS_PER_THREAD: usize = 4;

/// The process-wide pool.
pub struct ThreadPool {
    shared: Arc<Shared>,
    num_threads: usize,
    /// One launch at a time (launches from different foreign threads queue here).
    launch: Mutex<()>,
}

/// The number of physical cores (distinct `(physical id, core id)` pairs in `/proc/cpuinfo`),
/// or the available parallelism where that cannot be read.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::BTreeSet::new();
    let mut phys = "";
    for line in info.lines() {
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "physical id" => phys = v.trim(),
                "core id" => {
                    cores.insert((phys.to_owned(), v.trim().to_owned()));
                }
                _ => {}
            }
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The number of workers the process-wide pool has, or will have once created:
/// `KILN_NUM_THREADS` where it is set to a positive count, else the physical cores. It does
/// not create the pool.
pub fn default_num_threads() -> usize {
    env_usize("KILN_NUM_THREADS")
        .filter(|&n| n > 0)
        .unwrap_or_else(physical_cores)
}

impl ThreadPool {
    /// The process-wide pool, created on first use.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = default_num_threads();
            let spin = env_usize("KILN_THREAD_POOL_SPIN")
                .unwrap_or(100_000)
                .min(u32::MAX as usize) as u32;
            ThreadPool::new(n, spin)
        })
    }

    fn new(num_threads: usize, spin: u32) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            cursor: AtomicU64::new(0),
            done: AtomicI32::new(0),
            error: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            spin,
        });
        let mut started = 1;
        for i in 1..num_threads {
            let s = shared.clone();
            let ok = std::thread::Builder::new()
                .name(format!("kiln-pool-{i}"))
                .spawn(move || worker(s))
                .is_ok();
            if ok {
                started += 1;
            } else {
                log::warn!(
                    "kiln thread pool: could not start worker {i}; running with {started} threads"
                );
                break;
            }
        }
        ThreadPool {
            shared,
            num_threads: started,
            launch: Mutex::new(()),
        }
    }

    /// The number of threads that run tasks, the caller included.
    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    /// Runs `lambda(task, env, cdata)` for `task` in `0..num_task` (`num_task <= 0`:
    /// [`TASKS_PER_THREAD`] tasks per thread, or one when the launch runs serially) and returns 0, or the first failing task's code with its error raised on this
    /// thread.
    ///
    /// # Safety
    /// - `lambda` may be called concurrently from several threads with `cdata`.
    pub unsafe fn launch(&self, lambda: ParallelLambda, cdata: *mut c_void, num_task: i32) -> i32 {
        let serial = self.num_threads <= 1 || IN_TASK.with(Cell::get);
        let num_task = match (num_task, serial) {
            (n, _) if n > 0 => n,
            (_, true) => 1,
            // More tasks than threads, claimed dynamically: when another process takes a core
            // for a while, the other threads take over its share instead of waiting for it.
            (_, false) => (self.num_threads * TASKS_PER_THREAD).min(i32::MAX as usize) as i32,
        };
        if serial || num_task == 1 {
            // SAFETY: forwarded from the caller.
            return unsafe { run_serial(lambda, cdata, num_task) };
        }
        let _guard = self.launch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        let generation = (s.generation.load(Ordering::Relaxed) + 1) as u32;
        {
            let mut job = s.job.lock().unwrap_or_else(|e| e.into_inner());
            *job = Some(Job {
                lambda,
                cdata: cdata as usize,
                num_task,
                generation,
            });
            *s.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
            s.done.store(0, Ordering::Relaxed);
            s.cursor
                .store(u64::from(generation) << 32, Ordering::SeqCst);
            s.generation.store(u64::from(generation), Ordering::SeqCst);
        }
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _p = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let job = Job {
            lambda,
            cdata: cdata as usize,
            num_task,
            generation,
        };
        run_tasks(s, &job);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < num_task {
            spins = spins.wrapping_add(1);
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let err = s.error.lock().unwrap_or_else(|e| e.into_inner()).take();
        match err {
            None => 0,
            Some((code, kind, message)) => {
                ffi::set_raised(&kind, &message);
                code
            }
        }
    }
}

/// # Safety
/// - as [`ThreadPool::launch`].
unsafe fn run_serial(lambda: ParallelLambda, cdata: *mut c_void, num_task: i32) -> i32 {
    let mut env = TVMParallelGroupEnv {
        sync_handle: std::ptr::null_mut(),
        num_task,
    };
    let was = IN_TASK.with(|t| t.replace(true));
    let mut code = 0;
    for task in 0..num_task {
        // SAFETY: the caller vouches for the lambda and its data; tasks run one at a time.
        code = unsafe { lambda(task, &mut env, cdata) };
        if code != 0 {
            break;
        }
    }
    IN_TASK.with(|t| t.set(was));
    code
}

/// Claims and runs tasks of `job` until none are left.
fn run_tasks(s: &Shared, job: &Job) {
    let tag = u64::from(job.generation) << 32;
    let mut env = TVMParallelGroupEnv {
        sync_handle: std::ptr::null_mut(),
        num_task: job.num_task,
    };
    let was = IN_TASK.with(|t| t.replace(true));
    loop {
        let c = s.cursor.load(Ordering::Acquire);
        if c & !0xffff_ffff != tag || (c & 0xffff_ffff) as i32 >= job.num_task {
            break;
        }
        if s.cursor
            .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let task = (c & 0xffff_ffff) as i32;
        // SAFETY: `launch`'s caller allowed concurrent calls of the lambda with its data, and the
        // launcher keeps both alive until every task of this generation is done.
        let code = unsafe { (job.lambda)(task, &mut env, job.cdata as *mut c_void) };
        if code != 0 {
            let (kind, message) = ffi::take_raised().unwrap_or_else(|| {
                (
                    "RuntimeError".into(),
                    format!(
                        "parallel task {task} failed with code {code} without raising an error"
                    ),
                )
            });
            let mut e = s.error.lock().unwrap_or_else(|e| e.into_inner());
            if e.is_none() {
                *e = Some((code, kind, message));
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
    IN_TASK.with(|t| t.set(was));
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            if spins < s.spin {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let guard = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = s
                .wake
                .wait_while(guard, |_| s.generation.load(Ordering::SeqCst) == seen)
                .unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            break;
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            seen = u64::from(job.generation);
            run_tasks(&s, &job);
        }
    }
}

/// kiln's `TVMBackendParallelLaunch(lambda, cdata, num_task)`, written into the context slot
/// `__TVMBackendParallelLaunch` of the libraries kiln loads and of its JIT modules.
///
/// # Safety
/// - `lambda` is NULL (an error is raised) or may be called concurrently with `cdata`.
pub unsafe extern "C" fn kiln_backend_parallel_launch(
    lambda: Option<ParallelLambda>,
    cdata: *mut c_void,
    num_task: i32,
) -> i32 {
    let Some(lambda) = lambda else {
        ffi::set_raised(
            "RuntimeError",
            "TVMBackendParallelLaunch called with a NULL lambda",
        );
        return -1;
    };
    let r = std::panic::catch_unwind(|| {
        // SAFETY: forwarded from the caller.
        unsafe { ThreadPool::global().launch(lambda, cdata, num_task) }
    });
    r.unwrap_or_else(|_| {
        ffi::set_raised("RuntimeError", "the kiln thread pool panicked");
        -1
    })
}

/// Registers the launcher as a context slot for libraries loaded from now on (idempotent).
pub fn register_runtime_symbols() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let f: unsafe extern "C" fn(Option<ParallelLambda>, *mut c_void, i32) -> i32 =
            kiln_backend_parallel_launch;
        crate::packed_func::context::register_context_symbol(
            "__TVMBackendParallelLaunch",
            f as usize,
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    unsafe extern "C" fn add_task(
        task: i32,
        env: *mut TVMParallelGroupEnv,
        cdata: *mut c_void,
    ) -> i32 {
        // SAFETY: the tests pass an `AtomicI64` as cdata and a valid env.
        let (sum, n) = unsafe { (&*cdata.cast::<AtomicI64>(), (*env).num_task) };
        sum.fetch_add(i64::from(task) + 1000 * i64::from(n), Ordering::SeqCst);
        0
    }

    unsafe extern "C" fn failing_task(
        task: i32,
        _env: *mut TVMParallelGroupEnv,
        _cdata: *mut c_void,
    ) -> i32 {
        if task == 3 {
            ffi::set_raised("ValueError", "task 3 failed");
            return -1;
        }
        0
    }

    unsafe extern "C" fn nested_task(
        _task: i32,
        _env: *mut TVMParallelGroupEnv,
        cdata: *mut c_void,
    ) -> i32 {
        // SAFETY: forwarding the test's cdata to the inner launch.
        unsafe { kiln_backend_parallel_launch(Some(add_task), cdata, 4) }
    }

    #[test]
    fn every_task_runs_once_with_the_launch_task_count() {
        let pool = ThreadPool::new(3, 1000);
        for round in 0..200 {
            let sum = AtomicI64::new(0);
            // SAFETY: `add_task` is thread-safe over an AtomicI64.
            let code =
                unsafe { pool.launch(add_task, (&sum as *const AtomicI64).cast_mut().cast(), 7) };
            assert_eq!(code, 0);
            assert_eq!(
                sum.load(Ordering::SeqCst),
                (0..7).sum::<i64>() + 7 * 7000,
                "round {round}"
            );
        }
    }

    #[test]
    fn a_default_launch_splits_into_several_tasks_per_thread() {
        let pool = ThreadPool::new(2, 1000);
        let sum = AtomicI64::new(0);
        // SAFETY: `add_task` is thread-safe over an AtomicI64.
        let code =
            unsafe { pool.launch(add_task, (&sum as *const AtomicI64).cast_mut().cast(), 0) };
        assert_eq!(code, 0);
        let n = (2 * TASKS_PER_THREAD) as i64;
        assert_eq!(
            sum.load(Ordering::SeqCst),
            (0..n).sum::<i64>() + n * n * 1000
        );
        let pool = ThreadPool::new(1, 0);
        let sum = AtomicI64::new(0);
        // SAFETY: as above.
        let code =
            unsafe { pool.launch(add_task, (&sum as *const AtomicI64).cast_mut().cast(), 0) };
        assert_eq!(code, 0);
        assert_eq!(sum.load(Ordering::SeqCst), 1000, "one thread: one task");
    }

    #[test]
    fn a_failing_task_raises_its_error_on_the_launching_thread() {
        let pool = ThreadPool::new(2, 0);
        // SAFETY: `failing_task` touches no data.
        let code = unsafe { pool.launch(failing_task, std::ptr::null_mut(), 8) };
        assert_eq!(code, -1);
        assert_eq!(
            ffi::take_raised(),
            Some(("ValueError".into(), "task 3 failed".into()))
        );
    }

    #[test]
    fn nested_launches_run_serially_instead_of_deadlocking() {
        let sum = AtomicI64::new(0);
        // SAFETY: nested tasks use the AtomicI64 only.
        let code = unsafe {
            kiln_backend_parallel_launch(
                Some(nested_task),
                (&sum as *const AtomicI64).cast_mut().cast(),
                3,
            )
        };
        assert_eq!(code, 0);
        assert_eq!(
            sum.load(Ordering::SeqCst),
            3 * ((0..4).sum::<i64>() + 4 * 4000)
        );
    }

    #[test]
    fn a_null_lambda_is_an_error_not_a_crash() {
        // SAFETY: NULL is handled.
        let code = unsafe { kiln_backend_parallel_launch(None, std::ptr::null_mut(), 2) };
        assert_eq!(code, -1);
        assert!(ffi::take_raised().unwrap().1.contains("NULL lambda"));
    }

    #[test]
    fn launches_from_many_threads_at_once_are_all_correct() {
        let pool = Arc::new(ThreadPool::new(2, 100));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let sum = AtomicI64::new(0);
                        // SAFETY: as above.
                        let code = unsafe {
                            pool.launch(add_task, (&sum as *const AtomicI64).cast_mut().cast(), 5)
                        };
                        assert_eq!(code, 0);
                        assert_eq!(sum.load(Ordering::SeqCst), 10 + 5 * 5000);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}
