//! A persistent helper thread that compiles one piece of a JIT module (its wrappers) while the
//! caller compiles the rest.
//!
//! Why not a new thread per build: a freshly spawned thread usually starts on the spawner's core
//! and waits there until the spawner blocks (seen on 2-core VMs: about 1 ms late, as long as the
//! work it was meant to overlap), while a parked thread woken by a condition variable starts
//! within tens of microseconds on the other core.
//!
//! The handoff never waits for a busy helper: when the caller finishes its own part before the
//! helper picked the task up (the helper is busy with another build, or could not start), the
//! caller takes the task back and runs it itself.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::{CodegenError, R};

type Task = Box<dyn FnOnce() -> R<Vec<Vec<u8>>> + Send>;

enum State {
    Queued(Task),
    Running,
    Done(R<Vec<Vec<u8>>>),
    /// Taken back by its owner, or its result collected.
    Gone,
}

/// One task and its result.
struct Handoff {
    state: Mutex<State>,
    done: Condvar,
}

impl Handoff {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::util::lock(&self.state)
    }

    /// Runs the task here if nobody took it yet.
    fn run(&self) {
        let task = {
            let mut st = self.lock();
            match std::mem::replace(&mut *st, State::Running) {
                State::Queued(task) => task,
                other => {
                    *st = other;
                    return;
                }
            }
        };
        let result = run_caught(task);
        *self.lock() = State::Done(result);
        self.done.notify_all();
    }
}

fn run_caught(task: Task) -> R<Vec<Vec<u8>>> {
    catch_unwind(AssertUnwindSafe(task)).unwrap_or_else(|_| {
        Err(CodegenError::Llvm(
            "kiln bug: a panic while compiling part of a JIT module".into(),
        ))
    })
}

struct Helper {
    queue: Mutex<VecDeque<Arc<Handoff>>>,
    wake: Condvar,
}

/// The helper, started on first use; `None` when its thread could not start.
fn helper() -> Option<&'static Helper> {
    static HELPER: OnceLock<Option<Helper>> = OnceLock::new();
    HELPER
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("kiln-jit-helper".into())
                .spawn(serve)
                .ok()
                .map(|_| Helper {
                    queue: Mutex::default(),
                    wake: Condvar::new(),
                })
        })
        .as_ref()
}

fn serve() {
    let Some(h) = helper() else {
        return;
    };
    loop {
        let next = {
            let mut q = h.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(t) = q.pop_front() {
                    break t;
                }
                q = h.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        next.run();
    }
}

/// Runs `task` on the helper thread while `here` runs on this one, and returns both results.
/// `task` runs on this thread, after `here`, when the helper has not picked it up by then.
pub(crate) fn beside<U>(
    task: impl FnOnce() -> R<Vec<Vec<u8>>> + Send + 'static,
    here: impl FnOnce() -> U,
) -> (R<Vec<Vec<u8>>>, U) {
    let handoff = Arc::new(Handoff {
        state: Mutex::new(State::Queued(Box::new(task))),
        done: Condvar::new(),
    });
    if let Some(h) = helper() {
        h.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(handoff.clone());
        h.wake.notify_one();
    }
    let u = here();
    let mut st = handoff.lock();
    loop {
        match std::mem::replace(&mut *st, State::Gone) {
            State::Queued(task) => {
                drop(st);
                return (run_caught(task), u);
            }
            State::Done(result) => return (result, u),
            State::Running => {
                *st = State::Running;
                st = handoff.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            State::Gone => {
                return (
                    Err(CodegenError::Llvm(
                        "kiln bug: a JIT compilation task vanished".into(),
                    )),
                    u,
                )
            }
        }
    }
}
