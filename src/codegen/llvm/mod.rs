//! The LLVM backend: IR module -> LLVM IR text -> parsed, verified and optimized by LLVM 14
//! (inkwell) -> either an in-process JIT module ([`LlvmModule`]) or an object, assembly or shared
//! library on disk ([`export`]).
//!
//! Everything the generated code depends on comes from [`CodegenOptions`] (triple, CPU, features,
//! optimization level, fast math, device type), which `kiln::build` derives from the `Target`:
//! the code generator never queries a device.

mod emit;
mod export;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault;
mod helper;
mod jit;
pub mod nvptx;
mod options;
mod packed;
mod quick;
pub mod stream;
mod tiering;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module as LlvmIrModule;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
    TargetTriple,
};
use inkwell::OptimizationLevel;

use crate::ir::{IRModule, Param, PrimFunc};
use crate::packed_func::{ffi::TVMFFISafeCallType, Module, PackedFunc};

use super::CodegenError;
pub use emit::Linkage;
use emit::{fn_attrs, EmitOptions, Emitter, ModuleText, Val};
pub(crate) use export::compile_text;
pub use export::export;
use export::{compile_object, compile_to, optimized_ll};
pub use options::CodegenOptions;
pub use packed::signature;
pub use tiering::{optimizing, wait_all_optimized, Tiering};

type R<T> = Result<T, CodegenError>;

fn init_llvm() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let cfg = InitializationConfig::default();
        LlvmTarget::initialize_x86(&cfg);
        LlvmTarget::initialize_aarch64(&cfg);
        LlvmTarget::initialize_nvptx(&cfg);
        // `initialize_native` also sets up the host's asm printer, which emitting objects needs.
        let _ = LlvmTarget::initialize_native(&cfg);
        // Innermost loops start on a 64-byte boundary (LLVM's default is 16): where a hot loop
        // starts within a cache line moves kernels by up to 10% between builds (TVM's exported
        // matmul runs 9% slower than the same code JIT-compiled for that reason alone). LLVM 14
        // has no per-function or C-API setting for it, only this process-wide option of the x86
        // backend (`--align-loops` reaches only llc's target options); it is parsed once, before
        // kiln's first compilation. Vectorized epilogues are off: they double the code LLVM
        // generates for an auto-vectorized loop (compile time) for the last few iterations.
        // The lowest code generation level (the JIT's quick tier, `tiering.rs`) keeps its fast
        // instruction selection but allocates registers like the higher levels: the fast
        // allocator spills every value live across blocks, which makes a matmul 5x slower;
        // the optimized one costs a few tenths of a millisecond more per module.
        // Copy loops are not turned into `memcpy` calls: a copy nest of constant extents (a
        // transpose of TVM's Relax models) becomes one `memcpy` per row, LLVM then unrolls the
        // outer loops fully (a call is cheap to its cost model) and expands each small
        // `memcpy` inline, and instruction selection over the resulting block of thousands of
        // loads and stores is quadratic: one transpose of a GPT-2 block took 2.2 s to compile
        // (34 ms with this option); the loops are vectorized instead.
        // Partial unrolling of loops without unroll metadata is capped at 64 operations for
        // every CPU: LLVM 14 takes the budget from the CPU's scheduling model, 50 for Intel's
        // and 512 for `znver3` (what it makes of a Zen 3 and a Zen 4), where a nest of 64 rows
        // of 48 floats became 32 rows of straight code, 6 KiB for a 0.3 us operator (TVM's
        // `relu` 0.65x TVM's speed on a Zen 3, 0.94-1.08x capped; the 4096-column softmax
        // 1.11x faster capped). NVPTX's own budget is 75. Loops that want more say so in
        // their metadata (`emit/stmt.rs`: register tiles, short loops that fold).
        let args = [
            c"kiln".as_ptr(),
            c"--x86-experimental-pref-innermost-loop-alignment=6".as_ptr(),
            c"--enable-epilogue-vectorization=false".as_ptr(),
            c"--optimize-regalloc".as_ptr(),
            c"--disable-loop-idiom-memcpy".as_ptr(),
            c"--unroll-partial-threshold=64".as_ptr(),
        ];
        // SAFETY: valid NUL-terminated strings that outlive the call; LLVM copies what it
        // keeps. Called once per process (OnceLock).
        unsafe {
            inkwell::llvm_sys::support::LLVMParseCommandLineOptions(
                args.len() as i32,
                args.as_ptr(),
                std::ptr::null(),
            )
        };
    });
}

fn target_machine(o: &CodegenOptions) -> R<TargetMachine> {
    init_llvm();
    let triple = TargetTriple::create(&o.triple);
    let target = LlvmTarget::from_triple(&triple).map_err(|e| {
        CodegenError::Llvm(format!("target triple `{}`: {}", o.triple, e.to_string()))
    })?;
    target
        .create_target_machine(
            &triple,
            &o.cpu,
            &o.features,
            o.llvm_opt(),
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            CodegenError::Llvm(format!(
                "LLVM cannot create a target machine for `{}` cpu `{}` features `{}`",
                o.triple, o.cpu, o.features
            ))
        })
}

/// Whether a target triple is x86 (`x86_64`, `i386` to `i686`).
pub(crate) fn is_x86(triple: &str) -> bool {
    let arch = triple.split('-').next().unwrap_or("");
    arch == "x86_64" || (arch.len() == 4 && arch.starts_with('i') && arch.ends_with("86"))
}

/// Generates the LLVM IR text of a (verified) module.
pub fn generate_ir(module: &IRModule, o: &CodegenOptions, linkage: &Linkage) -> R<String> {
    let [one] = generate::<1>(module, o, linkage)?;
    Ok(one)
}

/// `N == 1`: one module. `N == 2` (JIT only): the LLVM IR of a JIT module as two modules, the
/// wrappers (not optimized: quick to compile) and the rest. A JIT module's compute functions
/// are external, with the linkage's suffix, to be looked up, and the wrappers reach them
/// through the linkage's table of compute functions.
fn generate<const N: usize>(
    module: &IRModule,
    o: &CodegenOptions,
    linkage: &Linkage,
) -> R<[String; N]> {
    let texts = generate_parts(module, o, linkage, N == 2, 1)?;
    texts.try_into().map_err(|v: Vec<String>| {
        CodegenError::Llvm(format!("kiln bug: {} module texts, expected {N}", v.len()))
    })
}

/// The LLVM IR of a module as `[wrappers, part 1, ..]` (`split`: a JIT module) or `[all]`:
/// with `split`, the functions other than the wrappers go into `parts` modules (as many as
/// there are functions, at most), each PrimFunc's whole in one, balanced by the size of their
/// text, the wrappers' module counting as half its size more load for the first part (which
/// `LlvmModule::jit_impl` compiles on the helper thread after the wrappers).
fn generate_parts(
    module: &IRModule,
    o: &CodegenOptions,
    linkage: &Linkage,
    split: bool,
    parts: usize,
) -> R<Vec<String>> {
    // JIT compute functions are looked up by name to fill the module's table of them (in the
    // quick tier; the optimized tier inlines them into the implementations).
    let jit = matches!(linkage, Linkage::Jit { .. });
    let optimized_tier = matches!(
        linkage,
        Linkage::Jit {
            optimized: true,
            ..
        }
    );
    if split && !jit {
        return Err(CodegenError::Llvm(
            "kiln bug: only JIT modules are split".into(),
        ));
    }
    let eo = EmitOptions {
        cpu: o.cpu.clone(),
        features: o.features.clone(),
        fast_math: o.fast_math.clone(),
        device_type: o.device_type,
        device_name: o.device_name.clone(),
        kernels: if o.device_host {
            crate::codegen::device::plan_module(module)?
        } else {
            Vec::new()
        },
        device_host: o.device_host,
        stream_store_bytes: o.stream_store_bytes,
        nvptx: false,
        vector_bits: o.clone().resolved().vector_register_bits(),
        stack_probes: is_x86(&o.triple),
    };
    let mut mt = ModuleText::default();
    let mut metadata = vec![
        "!0 = !{!\"branch_weights\", i32 1048576, i32 1}".to_string(),
        "!1 = !{!\"branch_weights\", i32 1, i32 1048576}".to_string(),
    ];
    let mut md_next = 2usize;
    let attrs = fn_attrs(&eo);
    // With `split`: the wrapper module's functions.
    let mut wrapper_fns: Vec<String> = Vec::new();
    let mut exported = Vec::new();
    // A host function of a device target's module (`FuncAttrs::host`) is CPU code: host
    // tensors, no kernels.
    let host_eo = EmitOptions {
        device_type: crate::packed_func::DLDeviceType::CPU.0,
        device_name: "cpu".into(),
        device_host: false,
        ..eo.clone()
    };
    // The range of `mt.functions` that each function's code takes.
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    for f in &module.functions {
        let Some(symbol) = f.attrs.global_symbol.clone() else {
            continue;
        };
        let first = mt.functions.len();
        let eo = if f.attrs.host && eo.device_host {
            &host_eo
        } else {
            &eo
        };
        if !symbol
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
            || symbol.is_empty()
        {
            return Err(CodegenError::Unsupported(format!(
                "function `{}`: global symbol `{symbol}` must be letters, digits and `_`",
                f.name
            )));
        }
        // A workspace that only copies a parameter unchanged (TOPI's padding of a
        // convolution with none) is read in place: one copy of the input less per call
        // (`schedule::inline_copies`, `noalias` functions only). Device host code keeps its
        // kernels as written.
        let inlined = (!eo.device_host)
            .then(|| crate::schedule::inline_copies(f))
            .flatten();
        let f = inlined.as_ref().map_or(f, |(g, _)| g);
        let sfx = linkage.suffix();
        let safe_params = "i8* %self, %ffi.any* %args, i32 %num_args, %ffi.any* %ret";
        if let Linkage::Checkers { .. } = linkage {
            // The error path of a JIT wrapper, with TVM's messages.
            let body = {
                let mut e = Emitter::new(&mut mt, eo, &f.name, &mut metadata, &mut md_next);
                packed::emit(f, &mut e, packed::Mode::Checker, "")?;
                e.finish()
            };
            mt.functions.push(format!(
                "define i32 @\"__kiln_check_{symbol}{sfx}\"({safe_params}) {attrs} cold {{\n{body}}}\n"
            ));
            exported.push(symbol);
            continue;
        }
        // The packed wrapper: the checks without their messages, a failure handed to the
        // checker, which raises TVM's error. Exported: the checker is an internal function of
        // the library, unoptimized (`optnone`: it only runs for bad or unusual arguments, and
        // optimizing it cost ~10 % of an export's build), and the wrapper's checks cost a few
        // instructions and branches (issue #16: a C host's call of a 1-element vadd, 7.0 ->
        // 4.8 ns on a Sapphire-Rapids-class Xeon, against 3.6 ns for a C function decoding the
        // same arguments; `docs/performance.md`). In the JIT: the
        // checker is compiled lazily; the quick tier's wrapper is built for compile speed: a
        // call of kiln's argument decoder (`quick.rs`; the compiled conjunction of checks for
        // device host code), which LLVM skips (`optnone`) and selects without optimizing
        // (FastISel). The optimized tier's wrapper
        // is an exported library's, its slow path the lazy checker, and replaces it through
        // the entry stub (`tiering.rs`).
        let mut decoder = None;
        let (slow, compute_slot, quick) = match linkage {
            Linkage::Jit {
                check: (entry, cx),
                calls,
                quick,
                ..
            } => (
                format!(
                    "call i32 inttoptr (i64 {entry} to i32 (i8*, %ffi.any*, i32, i32)*)(i8* inttoptr (i64 {cx} to i8*), %ffi.any* %args, i32 %num_args, i32 {index})",
                    index = exported.len()
                ),
                if optimized_tier {
                    None
                } else {
                    if *quick != 0 {
                        decoder = quick::describe(f, o.device_host, o.device_type)
                            .map(|q| (q, (*quick, *cx, exported.len())));
                    }
                    Some(calls + exported.len() * std::mem::size_of::<usize>())
                },
                if optimized_tier { "" } else { " noinline optnone" },
            ),
            Linkage::Export => {
                let body = {
                    let mut e = Emitter::new(&mut mt, eo, &f.name, &mut metadata, &mut md_next);
                    packed::emit(f, &mut e, packed::Mode::Checker, "")?;
                    e.finish()
                };
                mt.functions.push(format!(
                    "define internal i32 @\"__kiln_check_{symbol}\"({safe_params}) {attrs} cold noinline optnone {{\n{body}}}\n"
                ));
                (
                    format!("call i32 @\"__kiln_check_{symbol}\"(i8* %self, %ffi.any* %args, i32 %num_args, %ffi.any* %ret)"),
                    None,
                    "",
                )
            }
            Linkage::Checkers { .. } => {
                return Err(CodegenError::Llvm(
                    "kiln bug: a checkers module has no wrappers".into(),
                ))
            }
        };
        let mode = match compute_slot {
            Some(compute_slot) => packed::Mode::Conjunction {
                slow: &slow,
                compute_slot,
            },
            None => packed::Mode::Branches { slow: &slow },
        };
        let cname = if jit {
            format!("{}_compute_{sfx}", f.name)
        } else {
            format!("{}_compute_", f.name)
        };
        let (wrapper, sig) = match (&decoder, mode) {
            (
                Some((q, at)),
                packed::Mode::Conjunction {
                    slow, compute_slot, ..
                },
            ) => {
                // The decoder's wrapper (`quick.rs`); its compute signature must be the
                // compiled checks' (checked in debug builds: the tests).
                let mut e = Emitter::new(&mut mt, eo, &f.name, &mut metadata, &mut md_next);
                let sig = packed::emit_quick(f, &mut e, q, *at, slow, compute_slot, &cname);
                if cfg!(debug_assertions) {
                    let (mut smt, mut smd, mut snext) = (ModuleText::default(), Vec::new(), 0);
                    let mut se = Emitter::new(&mut smt, eo, &f.name, &mut smd, &mut snext);
                    let compiled = packed::emit(
                        f,
                        &mut se,
                        packed::Mode::Conjunction { slow, compute_slot },
                        &cname,
                    )?;
                    if compiled != sig {
                        return Err(CodegenError::Llvm(format!(
                            "kiln bug: the quick decoder's signature of `{}` is {sig:?}, the compiled checks' {compiled:?}",
                            f.name
                        )));
                    }
                }
                (e.finish(), sig)
            }
            (_, mode) => {
                let mut e = Emitter::new(&mut mt, eo, &f.name, &mut metadata, &mut md_next);
                let sig = packed::emit(f, &mut e, mode, &cname)?;
                (e.finish(), sig)
            }
        };
        let na = if f.attrs.noalias { "noalias " } else { "" };
        let params = format!("i8* %self, %ffi.any* {na}%args, i32 %num_args, %ffi.any* {na}%ret");
        if let Linkage::Jit { entries, .. } = linkage {
            // The exported entry: a jump through the table of entries to the implementation
            // (`tiering.rs`), in the first module.
            let slot = entries + exported.len() * std::mem::size_of::<usize>();
            let stub = format!(
                "define i32 @\"__tvm_ffi_{symbol}{sfx}\"({params}) {attrs} {{\nentry:\n  %p = load atomic i8*, i8** inttoptr (i64 {slot} to i8**) acquire, align 8\n  %f = bitcast i8* %p to i32 (i8*, %ffi.any*, i32, %ffi.any*)*\n  %r = musttail call i32 %f(i8* %self, %ffi.any* %args, i32 %num_args, %ffi.any* %ret)\n  ret i32 %r\n}}\n"
            );
            let wrapper = format!(
                "define i32 @\"__kiln_impl_{symbol}{sfx}\"({params}) {attrs}{quick} {{\n{wrapper}}}\n"
            );
            if split {
                wrapper_fns.push(stub);
            } else {
                mt.functions.push(stub);
            }
            // A quick wrapper goes with the stubs (unoptimized), an optimized one with its
            // compute function.
            if split && !optimized_tier {
                wrapper_fns.push(wrapper);
            } else {
                mt.functions.push(wrapper);
            }
        } else {
            let wrapper = format!(
                "define i32 @\"__tvm_ffi_{symbol}{sfx}\"({params}) {attrs}{quick} {{\n{wrapper}}}\n"
            );
            mt.functions.push(wrapper);
        }
        // The compute function.
        mt.stream_bufs.extend(stream::stream_outputs(f));
        let body = {
            let mut e = Emitter::new(&mut mt, eo, &f.name, &mut metadata, &mut md_next);
            for (id, ty) in &sig.buffers {
                e.bufs.insert(
                    *id,
                    Val {
                        ty: ty.clone(),
                        v: format!("%buf{}", id.0),
                    },
                );
            }
            for (id, ty) in &sig.vars {
                e.vars.insert(
                    *id,
                    Val {
                        ty: ty.clone(),
                        v: format!("%var{}", id.0),
                    },
                );
            }
            if f.ret_type.is_some() {
                e.ret_slot = Some("%ret_slot".into());
                e.ret_type = f.ret_type;
            }
            // Parameters not bound by the wrapper (e.g. unused scalars) are still in scope.
            for p in &f.params {
                if let Param::Scalar(v) = p {
                    e.vars.entry(v.id).or_insert_with(|| Val {
                        ty: emit::reg_ty(v.dtype),
                        v: "undef".into(),
                    });
                }
            }
            // Loops split at their `if_then_else` bounds (`codegen::partition`), then
            // reductions' first-iteration initializations hoisted out of their loops
            // (`codegen::peel`), then reduction nests moved outside a spatial loop along which
            // they read contiguously (`codegen::interchange`: a column max runs a vector of
            // columns at a time), then the float max/min reductions left in integer-key form
            // (`codegen::reduce`), then the operands that a spatial loop reads across packed
            // and those nests moved too, then transposing copies blocked by cache lines
            // (`codegen::block`); device host code keeps its kernels as written.
            if eo.device_host {
                e.stmt(&f.body)?;
            } else {
                let partitioned = crate::codegen::partition::partition_loops(&f.body);
                let interchanged = PrimFunc {
                    body: crate::codegen::interchange::interchange_reductions(
                        f,
                        &crate::codegen::peel::hoist_first_iteration_guards(&partitioned),
                    ),
                    ..f.clone()
                };
                let lowered = crate::codegen::reduce::lower_minmax_reductions(&interchanged);
                let packed = crate::codegen::interchange::pack_transposed_operands(f, &lowered);
                let body = crate::codegen::block::block_strided_copies(
                    f,
                    &crate::codegen::interchange::interchange_reductions(f, &packed),
                );
                e.in_range_casts = Arc::new(crate::codegen::bounds::in_range_casts(&body));
                e.noalias = f.attrs.noalias;
                e.stmt(&body)?;
            }
            e.line("ret i32 0");
            e.finish()
        };
        let vis = if jit && !optimized_tier {
            ""
        } else {
            "internal "
        };
        mt.functions.push(format!(
            "define {vis}i32 @\"{}\"({}) {attrs} {{\n{body}}}\n",
            sig.name, sig.params
        ));
        if f.attrs.entry {
            let main = format!(
                "define i32 @\"__tvm_ffi_main{sfx}\"(i8* %self, %ffi.any* %args, i32 %n, %ffi.any* %ret) {attrs} {{\nentry:\n  %r = tail call i32 @\"__tvm_ffi_{symbol}{sfx}\"(i8* %self, %ffi.any* %args, i32 %n, %ffi.any* %ret)\n  ret i32 %r\n}}\n"
            );
            if split {
                wrapper_fns.push(main);
            } else {
                mt.functions.push(main);
            }
        }
        exported.push(symbol);
        ranges.push(first..mt.functions.len());
    }
    let header = "; generated by kiln\n%ffi.any = type { i32, i32, i64 }\n%dl.tensor = type { i8*, i32, i32, i32, i8, i8, i16, i64*, i64*, i64 }\n\n@__kiln_zero_i64 = private constant i64 0, align 8\n";
    let glue = runtime_glue(
        linkage,
        &mt,
        &attrs,
        o.device_meta.as_ref().map(|m| m.len() + 1),
    );
    // Each part: the header, the runtime glue, globals and declarations (internal or private,
    // so each part has its own copy), its functions, and the metadata.
    let part_text = |functions: &mut dyn Iterator<Item = &String>| {
        let mut out = String::from(header);
        out.push_str(&glue);
        mt.write_body_with(&mut out, functions);
        for m in &metadata {
            out.push_str(m);
            out.push('\n');
        }
        out
    };
    let mut texts = Vec::with_capacity(2 + parts);
    let wrappers_len: usize = wrapper_fns.iter().map(String::len).sum();
    if split {
        // The wrappers use the branch weights (`!0`, `!1`) and nothing of the runtime glue.
        let mut w = String::from(header);
        for f in &wrapper_fns {
            w.push_str(f);
            w.push('\n');
        }
        for m in &metadata[..2] {
            w.push_str(m);
            w.push('\n');
        }
        texts.push(w);
    }
    let parts = if split {
        parts.clamp(1, ranges.len().max(1))
    } else {
        1
    };
    if parts == 1 {
        texts.push(part_text(&mut mt.functions.iter()));
        return Ok(texts);
    }
    // Largest first, each to the lightest part; the first part starts with the wrappers.
    let size = |r: &std::ops::Range<usize>| -> usize {
        mt.functions[r.clone()].iter().map(String::len).sum()
    };
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(size(&ranges[k])));
    // A byte of the wrappers' text (no passes, mostly calls and loads) took about half the time
    // of a byte of quick compute code (a Relax LSTM cell on a Zen 4: 20 KB in 7.5 ms, 29 KB in
    // 20 ms).
    let mut load = vec![0usize; parts];
    load[0] = wrappers_len / 2;
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); parts];
    for k in order {
        let lightest = (0..parts).min_by_key(|&p| load[p]).unwrap_or(0);
        load[lightest] += size(&ranges[k]);
        members[lightest].push(k);
    }
    for mut m in members {
        m.sort_unstable();
        let mut fns = m
            .iter()
            .flat_map(|&k| mt.functions[ranges[k].clone()].iter());
        texts.push(part_text(&mut fns));
    }
    Ok(texts)
}

/// The global function of kiln's runtime that attaches an exported library's device module.
pub const ATTACH_DEVICE_MODULE: &str = "kiln.runtime.attach_device_module";

/// `__kiln_device_attach()`: calls tvm-ffi's global `kiln.runtime.attach_device_module` with
/// this library's `__kiln_device_meta` and the addresses of its two device slots, which the
/// function fills. Returns 0 when it ran, -1 when it raised (the error is the thread's raised
/// error), 1 when this process has no tvm-ffi or no such function.
fn attach_glue(meta_len: usize) -> String {
    let name = ATTACH_DEVICE_MODULE;
    let n = name.len();
    format!(
        "%ffi.bytes = type {{ i8*, i64 }}\n\
declare extern_weak i32 @TVMFFIFunctionGetGlobal(%ffi.bytes*, i8**)\n\
declare extern_weak i32 @TVMFFIFunctionCall(i8*, %ffi.any*, i32, %ffi.any*)\n\
declare extern_weak i32 @TVMFFIObjectDecRef(i8*)\n\
@.kiln.attach.name = private unnamed_addr constant [{n} x i8] c\"{name}\", align 1\n\
@.kiln.attach.bytes = private constant %ffi.bytes {{ i8* getelementptr inbounds ([{n} x i8], [{n} x i8]* @.kiln.attach.name, i64 0, i64 0), i64 {n} }}, align 8\n\
define internal i32 @__kiln_device_attach() noinline nounwind {{\n\
entry:\n\
  %h = alloca i8*, align 8\n\
  %args = alloca [3 x %ffi.any], align 8\n\
  %res = alloca %ffi.any, align 8\n\
  %g0 = icmp eq i32 (%ffi.bytes*, i8**)* @TVMFFIFunctionGetGlobal, null\n\
  %c0 = icmp eq i32 (i8*, %ffi.any*, i32, %ffi.any*)* @TVMFFIFunctionCall, null\n\
  %d0 = icmp eq i32 (i8*)* @TVMFFIObjectDecRef, null\n\
  %gc = or i1 %g0, %c0\n\
  %absent = or i1 %gc, %d0\n\
  br i1 %absent, label %none, label %look\n\
look:\n\
  store i8* null, i8** %h, align 8\n\
  %rc = call i32 @TVMFFIFunctionGetGlobal(%ffi.bytes* @.kiln.attach.bytes, i8** %h)\n\
  %hv = load i8*, i8** %h, align 8\n\
  %rcbad = icmp ne i32 %rc, 0\n\
  %hnull = icmp eq i8* %hv, null\n\
  %bad = or i1 %rcbad, %hnull\n\
  br i1 %bad, label %none, label %call\n\
call:\n\
{args}\
  store %ffi.any {{ i32 0, i32 0, i64 0 }}, %ffi.any* %res, align 8\n\
  %a0 = getelementptr inbounds [3 x %ffi.any], [3 x %ffi.any]* %args, i64 0, i64 0\n\
  %r = call i32 @TVMFFIFunctionCall(i8* %hv, %ffi.any* %a0, i32 3, %ffi.any* %res)\n\
  %dr = call i32 @TVMFFIObjectDecRef(i8* %hv)\n\
  %failed = icmp ne i32 %r, 0\n\
  %out = select i1 %failed, i32 -1, i32 0\n\
  ret i32 %out\n\
none:\n\
  ret i32 1\n\
}}\n",
        args = [
            format!("getelementptr inbounds ([{meta_len} x i8], [{meta_len} x i8]* @__kiln_device_meta, i64 0, i64 0)"),
            "bitcast (i8** @__KilnDeviceLaunch to i8*)".to_string(),
            "bitcast (i8** @__kiln_device_module to i8*)".to_string(),
        ]
        .iter()
        .enumerate()
        .map(|(i, v)| {
            // A tvm-ffi opaque pointer: type index 4 (kTVMFFIOpaquePtr), the pointer's bits.
            format!(
                "  %p{i} = getelementptr inbounds [3 x %ffi.any], [3 x %ffi.any]* %args, i64 0, i64 {i}\n  store %ffi.any {{ i32 4, i32 0, i64 ptrtoint (i8* {v} to i64) }}, %ffi.any* %p{i}, align 8\n"
            )
        })
        .collect::<String>()
    )
}

/// The context slots and the internal helpers that reach them (`__kiln_raise`, ...).
/// `meta_len`: the length of the exported `__kiln_device_meta` string with its NUL, if the
/// module has one.
fn runtime_glue(
    linkage: &Linkage,
    mt: &ModuleText,
    attrs: &str,
    meta_len: Option<usize>,
) -> String {
    let mut s = String::new();
    let slot = |s: &mut String, name: &str| match linkage.slots() {
        Some(syms) => {
            let addr = syms.iter().find(|(n, _)| n == name).map_or(0, |(_, a)| *a);
            let init = if addr == 0 {
                "null".to_string()
            } else {
                format!("inttoptr (i64 {addr} to i8*)")
            };
            let _ = writeln!(s, "@{name} = internal constant i8* {init}, align 8");
        }
        None => {
            let _ = writeln!(s, "@{name} = global i8* null, align 8");
        }
    };
    slot(&mut s, "__TVMFFIErrorSetRaisedFromCStr");
    let weak = matches!(linkage, Linkage::Export);
    if weak {
        s.push_str("declare extern_weak void @TVMFFIErrorSetRaisedFromCStr(i8*, i8*)\n");
    }
    let _ = writeln!(
        s,
        "define internal void @__kiln_raise(i8* %kind, i8* %msg) cold noinline nounwind {{\nentry:\n  %f = load i8*, i8** @__TVMFFIErrorSetRaisedFromCStr, align 8\n  %isnull = icmp eq i8* %f, null\n  br i1 %isnull, label %fallback, label %call\ncall:\n  %fp = bitcast i8* %f to void (i8*, i8*)*\n  call void %fp(i8* %kind, i8* %msg)\n  ret void\nfallback:\n{}}}",
        if weak {
            "  %w = icmp eq void (i8*, i8*)* @TVMFFIErrorSetRaisedFromCStr, null\n  br i1 %w, label %none, label %callw\ncallw:\n  call void @TVMFFIErrorSetRaisedFromCStr(i8* %kind, i8* %msg)\n  ret void\nnone:\n  ret void\n"
        } else {
            "  ret void\n"
        }
    );
    if mt.uses_parallel {
        slot(&mut s, "__TVMBackendParallelLaunch");
        // Without a loader's pool: JIT modules run the tasks serially (kiln always fills the
        // slot), exported libraries use the persistent pool of the runtime linked into them
        // (`src/runtime/export_rt.c`), which returns -2 when a task failed on a worker.
        let serial = if weak {
            s.push_str("declare hidden i32 @__kiln_rt_parallel_launch(i32 (i32, { i8*, i32 }*, i8*)*, i8*, i32)\n");
            s.push_str("@.kiln.rte = private unnamed_addr constant [13 x i8] c\"RuntimeError\\00\", align 1\n");
            s.push_str("@.kiln.pfail = private unnamed_addr constant [47 x i8] c\"a parallel task failed on a thread of the pool\\00\", align 1\n");
            "  %s = call i32 @__kiln_rt_parallel_launch(i32 (i32, { i8*, i32 }*, i8*)* %lambda, i8* %cdata, i32 %n)\n  %wf = icmp eq i32 %s, -2\n  br i1 %wf, label %wfail, label %out\nwfail:\n  call void @__kiln_raise(i8* getelementptr inbounds ([13 x i8], [13 x i8]* @.kiln.rte, i64 0, i64 0), i8* getelementptr inbounds ([47 x i8], [47 x i8]* @.kiln.pfail, i64 0, i64 0))\n  ret i32 -1\nout:\n  ret i32 %s\n"
        } else {
            "  %env = alloca { i8*, i32 }, align 8\n  %e0 = getelementptr inbounds { i8*, i32 }, { i8*, i32 }* %env, i32 0, i32 0\n  store i8* null, i8** %e0, align 8\n  %e1 = getelementptr inbounds { i8*, i32 }, { i8*, i32 }* %env, i32 0, i32 1\n  store i32 1, i32* %e1, align 8\n  %s = call i32 %lambda(i32 0, { i8*, i32 }* %env, i8* %cdata)\n  ret i32 %s\n"
        };
        let _ = writeln!(
            s,
            "define internal i32 @__kiln_parallel_launch(i32 (i32, {{ i8*, i32 }}*, i8*)* %lambda, i8* %cdata, i32 %n) {attrs} {{\nentry:\n  %f = load i8*, i8** @__TVMBackendParallelLaunch, align 8\n  %isnull = icmp eq i8* %f, null\n  br i1 %isnull, label %serial, label %launch\nlaunch:\n  %fp = bitcast i8* %f to i32 (i32 (i32, {{ i8*, i32 }}*, i8*)*, i8*, i32)*\n  %r = call i32 %fp(i32 (i32, {{ i8*, i32 }}*, i8*)* %lambda, i8* %cdata, i32 %n)\n  ret i32 %r\nserial:\n{serial}}}"
        );
    }
    if mt.uses_device {
        // Kernel launches: the device runtime's service and this module's device module.
        slot(&mut s, "__KilnDeviceLaunch");
        slot(&mut s, "__kiln_device_module");
        let missing = "this function launches device kernels, which need kiln's device runtime; this host did not provide it (the context slots `__KilnDeviceLaunch` and `__kiln_device_module` are empty): load the library with kiln (`kiln run`, `kiln::runtime::LibraryModule::load`), or in a TVM process call `kiln.tvm.register_device_api(...)` first";
        let len = missing.len() + 1;
        let _ = writeln!(
            s,
            "@.kiln.nodev = private unnamed_addr constant [{len} x i8] c\"{}\", align 1\n@.kiln.rterr = private unnamed_addr constant [13 x i8] c\"RuntimeError\\00\", align 1",
            emit::c_string(missing)
        );
        // An exported library whose host filled no slot (TVM's `load_module`) asks kiln's
        // runtime, if this process has one, to attach its device module: through tvm-ffi's
        // global function `kiln.runtime.attach_device_module` (registered by Python's
        // `kiln.tvm`), found through the tvm-ffi of the process (weak: a plain C host has none).
        let attach_meta = meta_len.filter(|_| weak);
        let attach = if let Some(ml) = attach_meta {
            s.push_str(&attach_glue(ml));
            "attach:\n  %a = call i32 @__kiln_device_attach()\n  %aok = icmp eq i32 %a, 0\n  br i1 %aok, label %reload, label %afail\nafail:\n  %raised = icmp eq i32 %a, -1\n  br i1 %raised, label %error, label %missing\nerror:\n  ret i32 -1\nreload:\n  %f2 = load atomic i8*, i8** @__KilnDeviceLaunch acquire, align 8\n  %m2 = load atomic i8*, i8** @__kiln_device_module acquire, align 8\n  %f2null = icmp eq i8* %f2, null\n  %m2null = icmp eq i8* %m2, null\n  %none2 = or i1 %f2null, %m2null\n  br i1 %none2, label %missing, label %launch\n"
        } else {
            "attach:\n  br label %missing\n"
        };
        let _ = writeln!(
            s,
            "define internal i32 @__kiln_device_launch(i32 %k, i32 %dev, i8* %args, i32 %n, i64* %dims) nounwind {{\nentry:\n  %f1 = load atomic i8*, i8** @__KilnDeviceLaunch acquire, align 8\n  %m1 = load atomic i8*, i8** @__kiln_device_module acquire, align 8\n  %fnull = icmp eq i8* %f1, null\n  %mnull = icmp eq i8* %m1, null\n  %none = or i1 %fnull, %mnull\n  br i1 %none, label %attach, label %launch\n{attach}launch:\n  %f = phi i8* [ %f1, %entry ]{fphi}\n  %m = phi i8* [ %m1, %entry ]{mphi}\n  %fp = bitcast i8* %f to i32 (i8*, i32, i32, i8*, i32, i64*, i64*)*\n  %blk = getelementptr inbounds i64, i64* %dims, i64 3\n  %r = call i32 %fp(i8* %m, i32 %k, i32 %dev, i8* %args, i32 %n, i64* %dims, i64* %blk)\n  ret i32 %r\nmissing:\n  call void @__kiln_raise(i8* getelementptr inbounds ([13 x i8], [13 x i8]* @.kiln.rterr, i64 0, i64 0), i8* getelementptr inbounds ([{len} x i8], [{len} x i8]* @.kiln.nodev, i64 0, i64 0))\n  ret i32 -1\n}}",
            fphi = if attach_meta.is_some() { ", [ %f2, %reload ]" } else { "" },
            mphi = if attach_meta.is_some() { ", [ %m2, %reload ]" } else { "" },
        );
    }
    if mt.uses_workspace {
        slot(&mut s, "__TVMBackendAllocWorkspace");
        slot(&mut s, "__TVMBackendFreeWorkspace");
        // Without a loader's allocator: JIT modules use libc (kiln fills the slots anyway),
        // exported libraries the per-thread workspace cache of their runtime
        // (`src/runtime/export_rt.c`), reused across calls.
        let (alloc, free) = if weak {
            s.push_str("declare hidden i8* @__kiln_rt_alloc_workspace(i64)\ndeclare hidden void @__kiln_rt_free_workspace(i8*)\n");
            (
                "  %q = call i8* @__kiln_rt_alloc_workspace(i64 %n)\n  ret i8* %q\n",
                "  call void @__kiln_rt_free_workspace(i8* %p)\n  ret void\n",
            )
        } else {
            s.push_str("declare i8* @aligned_alloc(i64, i64)\ndeclare void @free(i8*)\n");
            (
                "  %a = add i64 %n, 63\n  %b = and i64 %a, -64\n  %z = icmp eq i64 %b, 0\n  %c = select i1 %z, i64 64, i64 %b\n  %q = call i8* @aligned_alloc(i64 64, i64 %c)\n  ret i8* %q\n",
                "  call void @free(i8* %p)\n  ret void\n",
            )
        };
        // `noalias` on the result, like `malloc`'s: a workspace block overlaps no other live
        // allocation or parameter, and the pool does not touch it while it is handed out.
        // `noinline` keeps the attribute on the call: inlined, the result would be a phi of two
        // calls, and LLVM would assume that two workspaces may overlap (an accumulator in one
        // was stored after every add that read the other: TOPI's padded `avg_pool2d` ran 1.4x
        // slower). One call per allocation is nothing next to the allocation.
        let _ = writeln!(
            s,
            "define internal noalias i8* @__kiln_alloc_workspace(i32 %dt, i32 %dev, i64 %n, i32 %code, i32 %bits) noinline nounwind {{\nentry:\n  %f = load i8*, i8** @__TVMBackendAllocWorkspace, align 8\n  %isnull = icmp eq i8* %f, null\n  br i1 %isnull, label %libc, label %pool\npool:\n  %fp = bitcast i8* %f to i8* (i32, i32, i64, i32, i32)*\n  %p = call i8* %fp(i32 %dt, i32 %dev, i64 %n, i32 %code, i32 %bits)\n  ret i8* %p\nlibc:\n{alloc}}}"
        );
        let _ = writeln!(
            s,
            "define internal void @__kiln_free_workspace(i32 %dt, i32 %dev, i8* %p) nounwind {{\nentry:\n  %f = load i8*, i8** @__TVMBackendFreeWorkspace, align 8\n  %isnull = icmp eq i8* %f, null\n  br i1 %isnull, label %libc, label %pool\npool:\n  %fp = bitcast i8* %f to i32 (i32, i32, i8*)*\n  %r = call i32 %fp(i32 %dt, i32 %dev, i8* %p)\n  ret void\nlibc:\n{free}}}"
        );
    }
    s
}

/// The LLVM passes run on a module before its machine code is generated (whose own level is
/// the options' `opt_level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Passes {
    /// None: a JIT module's wrappers, `optnone` anyway.
    None,
    /// A short function pipeline that still hoists invariants and vectorizes loops, at a
    /// third of O3's cost: a JIT module's first code (`tiering.rs`).
    Quick,
    /// LLVM's `default<O{n}>` pipeline for the options' `opt_level` (none at 0).
    Default,
}

/// The [`Passes::Quick`] pipeline.
const QUICK_PASSES: &str = "function(sroa,early-cse,simplifycfg,instcombine,loop-mssa(licm),loop-vectorize,instcombine,simplifycfg)";

/// Parses, verifies and optimizes IR text in `ctx`.
fn parse_and_optimize<'c>(
    ctx: &'c Context,
    text: &str,
    o: &CodegenOptions,
    passes: Passes,
    tm: &TargetMachine,
) -> R<LlvmIrModule<'c>> {
    let buf = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), "kiln");
    let m = ctx.create_module_from_ir(buf).map_err(|e| {
        CodegenError::Llvm(format!(
            "kiln generated IR that LLVM rejects (a kiln bug): {}",
            e.to_string()
        ))
    })?;
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    m.verify().map_err(|e| {
        CodegenError::Llvm(format!(
            "kiln generated invalid IR (a kiln bug): {}",
            e.to_string()
        ))
    })?;
    let pipeline = match passes {
        Passes::None => None,
        Passes::Quick => Some(QUICK_PASSES.to_owned()),
        Passes::Default if o.opt_level == 0 => None,
        Passes::Default => Some(format!("default<O{}>", o.opt_level.min(3))),
    };
    if let Some(pipeline) = pipeline {
        let pbo = PassBuilderOptions::create();
        pbo.set_loop_vectorization(true);
        pbo.set_loop_slp_vectorization(true);
        pbo.set_loop_unrolling(true);
        pbo.set_loop_interleaving(true);
        m.run_passes(&pipeline, tm, pbo).map_err(|e| {
            CodegenError::Llvm(format!("LLVM optimization failed: {}", e.to_string()))
        })?;
    }
    Ok(m)
}

/// The names of the exported functions of a module.
fn exported_names(module: &IRModule) -> Vec<String> {
    let mut v: Vec<String> = module
        .functions
        .iter()
        .filter_map(|f| f.attrs.global_symbol.clone())
        .collect();
    if module
        .functions
        .iter()
        .any(|f| f.attrs.entry && f.attrs.global_symbol.is_some())
    {
        v.push("main".into());
    }
    v.sort();
    v
}

/// The names of a JIT module's compute functions with `suffix`, by function index (the
/// functions with a global symbol, in module order).
fn compute_symbols(module: &IRModule, suffix: &str) -> Vec<String> {
    module
        .functions
        .iter()
        .filter(|f| f.attrs.global_symbol.is_some())
        .map(|f| format!("{}_compute_{suffix}", f.name))
        .collect()
}

/// The names of a JIT module's implementations (what its entry stubs jump to) with `suffix`,
/// by function index.
fn impl_symbols(module: &IRModule, suffix: &str) -> Vec<String> {
    module
        .functions
        .iter()
        .filter_map(|f| f.attrs.global_symbol.as_ref())
        .map(|s| format!("__kiln_impl_{s}{suffix}"))
        .collect()
}

/// What a JIT module owns. Field order is drop order: the wrappers and the quick code go first,
/// then the optimized code and the table of compute functions, then the checkers the error
/// path may have compiled.
struct JitInner {
    _code: jit::JitCode,
    tiers: Arc<tiering::Tiers>,
    _checks: Box<jit::LazyChecks>,
    /// The device module the host code launches kernels through (device targets only); its
    /// address is baked into the code, so it lives as long as the code.
    _device: Option<Arc<crate::runtime::DeviceModule>>,
}

/// A module compiled by the LLVM backend: its functions run in-process (JIT), and it can be
/// exported to `.so`, `.o`, `.ll` or `.s`.
pub struct LlvmModule {
    ir: Arc<IRModule>,
    opts: CodegenOptions,
    functions: BTreeMap<String, usize>,
    inner: Arc<JitInner>,
}

impl std::fmt::Debug for LlvmModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlvmModule")
            .field("functions", &self.functions.keys())
            .field("opts", &self.opts)
            .finish()
    }
}

impl LlvmModule {
    /// Compiles `module` (already verified) for in-process execution, in two tiers unless
    /// `KILN_JIT_TIERS=1` ([`Tiering::from_env`]).
    ///
    /// # Errors
    /// [`CodegenError`] when the module uses something the backend does not support, or LLVM
    /// fails.
    pub fn jit(module: &IRModule, opts: &CodegenOptions) -> R<Self> {
        Self::jit_with(module, opts, Tiering::from_env())
    }

    /// Compiles `module` (already verified) for in-process execution. With
    /// [`Tiering::Background`] and an `opt_level` of 2 or more, the functions are callable
    /// after a quick compilation and run code optimized at `opt_level` once a background thread
    /// has compiled it ([`LlvmModule::wait_optimized`]); with [`Tiering::Off`], that code is
    /// compiled before this returns; with [`Tiering::QuickOnly`], never.
    ///
    /// # Errors
    /// As [`LlvmModule::jit`].
    pub fn jit_with(module: &IRModule, opts: &CodegenOptions, tiering: Tiering) -> R<Self> {
        Self::jit_impl(module, opts, tiering, None)
    }

    /// The host code of a device target (`opts.device_host`), launching its kernels through
    /// `device`.
    pub(crate) fn jit_device(
        module: &IRModule,
        opts: &CodegenOptions,
        device: Arc<crate::runtime::DeviceModule>,
    ) -> R<Self> {
        Self::jit_impl(module, opts, Tiering::from_env(), Some(device))
    }

    fn jit_impl(
        module: &IRModule,
        opts: &CodegenOptions,
        tiering: Tiering,
        device: Option<Arc<crate::runtime::DeviceModule>>,
    ) -> R<Self> {
        let opts = opts.clone().resolved();
        crate::runtime::init();
        let suffix = jit::unique_suffix();
        let ir = Arc::new(module.clone());
        let checks = Box::new(jit::LazyChecks::new(ir.clone(), &opts, &suffix));
        let quick = tiering.quick_first(&opts);
        let compute = compute_symbols(module, &suffix);
        let impls = impl_symbols(module, &suffix);
        let tiers = Arc::new(tiering::Tiers::new(compute.len(), tiering, &opts));
        let mut linkage = checks.linkage(tiers.tables());
        if let (Some(d), Linkage::Jit { slots, .. }) = (&device, &mut linkage) {
            slots.push(("__kiln_device_module".into(), Arc::as_ptr(d) as usize));
        }
        // The stubs and quick wrappers (`optnone`) take no passes and the lowest code
        // generation level, as do quick compute functions. The rest is cut into two modules
        // by PrimFunc: the helper thread compiles the wrappers and then the first, this one the
        // second, balanced by the size of their text (on a 2-core machine about half the time
        // of one module). Compiled once at full level, those modules hold the optimized
        // implementations instead.
        let mut texts = generate_parts(module, &opts, &linkage.optimized(!quick), true, 2)?;
        let wrappers = texts.remove(0);
        // One part (one function): this thread compiles it, the helper the wrappers.
        let first = if texts.len() > 1 {
            Some(texts.remove(0))
        } else {
            None
        };
        let others = texts;
        let lowest = CodegenOptions {
            opt_level: 0,
            ..opts.clone()
        };
        let (rest_opts, rest_passes) = if quick {
            (lowest.clone(), Passes::Quick)
        } else {
            (opts.clone(), Passes::Default)
        };
        let (helper_opts, helper_passes) = (rest_opts.clone(), rest_passes);
        let (mut objects, here) = helper::beside(
            move || {
                let mut objects = vec![compile_text(
                    &wrappers,
                    &lowest,
                    Passes::None,
                    FileType::Object,
                )?];
                if let Some(first) = first {
                    objects.push(compile_text(
                        &first,
                        &helper_opts,
                        helper_passes,
                        FileType::Object,
                    )?);
                }
                Ok(objects)
            },
            || {
                others
                    .iter()
                    .map(|t| compile_text(t, &rest_opts, rest_passes, FileType::Object))
                    .collect::<R<Vec<Vec<u8>>>>()
            },
        );
        if let Ok(objects) = &mut objects {
            objects.extend(here?);
        }
        let objects = objects?;
        let names = exported_names(module);
        let mut symbols: Vec<String> = names
            .iter()
            .map(|n| format!("__tvm_ffi_{n}{suffix}"))
            .collect();
        let n_impls = impls.len();
        symbols.extend(impls);
        if quick {
            symbols.extend(compute);
        }
        let (code, addrs) = jit::load_objects(&objects, &symbols)?;
        let (wrapper_addrs, rest_addrs) = addrs.split_at(names.len());
        let (impl_addrs, compute_addrs) = rest_addrs.split_at(n_impls);
        tiers.point_calls(compute_addrs);
        tiers.point_entries(impl_addrs);
        if tiers.pending() {
            tiering::schedule(tiering::Job {
                tiers: Arc::downgrade(&tiers),
                ir: ir.clone(),
                opts: opts.clone(),
                linkage: linkage
                    .with_suffix(&format!("{suffix}.opt"))
                    .optimized(true),
            });
        }
        Ok(LlvmModule {
            ir,
            opts,
            functions: names
                .into_iter()
                .zip(wrapper_addrs.iter().copied())
                .collect(),
            inner: Arc::new(JitInner {
                _code: code,
                tiers,
                _checks: checks,
                _device: device,
            }),
        })
    }

    /// Blocks until the module runs code optimized at its options' level: at once unless it was
    /// compiled in two tiers and the background compilation has not finished.
    ///
    /// # Errors
    /// When the optimized compilation failed (the module keeps working, with its quick code).
    pub fn wait_optimized(&self) -> R<()> {
        self.inner.tiers.wait()
    }

    /// Whether the module runs code optimized at its options' level (see
    /// [`LlvmModule::wait_optimized`]).
    pub fn is_optimized(&self) -> bool {
        self.inner.tiers.is_optimized()
    }

    /// The options the module was compiled with (`native` resolved).
    pub fn options(&self) -> &CodegenOptions {
        &self.opts
    }

    /// Writes the module for another process: `.so` (linked by the system C compiler), `.o`,
    /// `.ll` (optimized LLVM IR) or `.s`, chosen by the extension of `path`.
    ///
    /// # Errors
    /// An unknown extension, LLVM failures, or the C compiler failing to link.
    pub fn export(&self, path: &Path) -> R<()> {
        export(&self.ir, &self.opts, path)
    }
}

impl Module for LlvmModule {
    fn type_key(&self) -> &str {
        "llvm"
    }

    fn get_function(&self, name: &str) -> Option<PackedFunc> {
        let addr = *self.functions.get(name)?;
        // SAFETY: `addr` is the JIT address of a `__tvm_ffi_*` function kiln generated with the
        // safe-call signature; the machine code lives as long as `inner`, which the PackedFunc
        // keeps; generated functions take a NULL `self` and are thread-safe.
        unsafe {
            let f: TVMFFISafeCallType = std::mem::transmute::<usize, TVMFFISafeCallType>(addr);
            let keep: Arc<dyn std::any::Any + Send + Sync> = self.inner.clone();
            Some(PackedFunc::from_safe_call(
                name,
                f,
                std::ptr::null_mut(),
                Some(keep),
            ))
        }
    }

    fn function_names(&self) -> Vec<String> {
        self.functions.keys().cloned().collect()
    }

    fn get_source(&self, format: &str) -> Option<String> {
        match format {
            "ll" | "llvm" => optimized_ll(&self.ir, &self.opts).ok(),
            "asm" | "s" => compile_to(&self.ir, &self.opts, FileType::Assembly)
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_tier_points_the_wrappers_at_new_code() {
        let ir = IRModule::from_functions(vec![crate::ir::kernels::vadd()]);
        let m = LlvmModule::jit_with(&ir, &CodegenOptions::host(), Tiering::Background).unwrap();
        let quick = m.inner.tiers.entry(0);
        assert_ne!(quick, 0);
        m.wait_optimized().unwrap();
        let optimized = m.inner.tiers.entry(0);
        assert_ne!(optimized, 0);
        assert_ne!(optimized, quick);
        let once = LlvmModule::jit_with(&ir, &CodegenOptions::host(), Tiering::Off).unwrap();
        assert_ne!(once.inner.tiers.entry(0), 0);
    }
}
