//! Errors of the tensor IR: reading JSON, verifying, interpreting.

/// Any error the IR reports. Every variant names where the problem is: a JSON path such as
/// `functions[0].body.body[2].value.args[1]` (the same syntax is used for node paths of IR
/// built in Rust, so verifier errors on a module read from JSON point at the JSON text).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum IrError {
    /// The text is not JSON, or is nested deeper than the reader accepts. Fix the input.
    #[error("invalid JSON: {message}")]
    Syntax {
        /// What the JSON parser reported (with line and column).
        message: String,
    },
    /// The JSON is well formed but does not follow the `kiln-ir/1` schema (unknown field,
    /// missing field, wrong type, unknown name). Fix the input.
    #[error("{path}: {message}")]
    Json {
        /// Where, as a JSON path.
        path: String,
        /// What was expected and what was found.
        message: String,
    },
    /// The IR is ill-formed (types, scoping, ranks, loop kinds, ...). Fix the producer.
    #[error("function `{func}`: {path}: {message}")]
    Verify {
        /// The function the node belongs to.
        func: String,
        /// The node path inside the function (JSON path syntax).
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The reference interpreter was given bad arguments or hit a run-time error (out of bounds
    /// access, integer division by zero, failed assert, ...).
    #[error("interpreting `{func}`: {message}")]
    Interp {
        /// The function being run.
        func: String,
        /// What went wrong.
        message: String,
    },
}

/// `Result` with [`IrError`].
pub type IrResult<T> = Result<T, IrError>;

/// Stack size of the thread the recursive passes (JSON reader, verifier, interpreter) run on.
/// Their recursion depth is bounded ([`super::json::MAX_DEPTH`], [`super::verify::MAX_NESTING`]),
/// and this bound times the (debug-build) frame size fits comfortably.
pub(crate) const PASS_STACK_SIZE: usize = 64 << 20;

/// Runs `f` on a scoped thread with a [`PASS_STACK_SIZE`] stack, so that deep (but bounded) IR
/// never overflows the caller's stack. Falls back to the current thread if no thread can be made.
pub(crate) fn with_big_stack<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let slot = std::sync::Mutex::new(Some(f));
    let take = || slot.lock().ok().and_then(|mut g| g.take());
    let outcome = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("kiln-ir".into())
            .stack_size(PASS_STACK_SIZE)
            .spawn_scoped(s, || take().map(|f| f()))
            .map(|h| h.join())
    });
    match outcome {
        Ok(Ok(Some(r))) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The thread could not be created (or found nothing to run): run here.
        _ => match take() {
            Some(f) => f(),
            None => unreachable!("the closure ran on the spawned thread, which returned its value"),
        },
    }
}
