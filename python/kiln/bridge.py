"""A bridge from TVM 0.27 to kiln: `to_kiln(mod_or_prim_func) -> dict`, a kiln-ir/1 module.

The kernels people already have live in TVM's TIR (TOPI operators, TVMScript). This module
runs TVM's own lowering on them and walks the lowered TIR through TVM's Python API, writing
kiln's IR (docs/ir.md) for `kiln build` / `kiln::ir::IRModule::from_json`:

    import tvm, kiln
    from tvm import te, topi
    A = te.placeholder((64, 64), name="A")
    mod = kiln.to_kiln(te.create_prim_func([A, topi.nn.relu(A)]))
    json.dump(mod, open("relu.json", "w"))       # then: kiln build relu.json -o relu.so

The lowering is the start of TVM 0.27's `s_tir` pipeline, the passes in `PASSES`, with
vectorization disabled: they turn schedulable blocks into plain loops, buffer stores and loads,
and allocations. kiln's IR keeps multi-dimensional buffers (its verifier and interpreter check
every index against its dimension), so the pipeline stops before `FlattenBuffer` and the passes
that work on flat buffers; kiln computes the addresses itself. (docs/tvm.md lists the passes.)

What is covered: `SeqStmt`, `For` of every kind (serial, parallel, vectorized and unrolled
kept as hints; thread-bound loops as kiln's `thread_binding`), `BufferStore`, `BufferLoad` (`TensorLoad` in 0.27),
`AllocBuffer`/`DeclBuffer` (an allocation scoped to the rest of its sequence), `LetStmt`/`Bind`,
`IfThenElse`, `Evaluate`, `AssertStmt`, every scalar operation and intrinsic of kiln's IR
(arithmetic, comparisons, logic, bitwise operations and shifts, casts, `select`, `let`,
`if_then_else`, `reinterpret`, the float functions, `call_extern`), symbolic shapes and
functions with several outputs. Anything else raises `BridgeError` naming the node type, where
it is (the path of fields from the function), and its TVMScript text, never a wrong module.

Allocations of at most 1024 bytes of constant size become kiln `local` buffers (stack or
registers), larger or symbolic ones `workspace` buffers, as TVM's own LowerTVMBuiltin decides.
"""

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx

# The s_tir pipeline of TVM 0.27 (tvm/s_tir/pipeline.py) up to LowerOpaqueBlock: everything
# before it that does not need a target, and nothing that flattens buffers.
PASSES = [
    "CanonicalizeLoop",
    "LowerCrossThreadReduction",
    "LowerInitBlock",
    "PlanAndUpdateBufferAllocationLocation",
    "ConvertBlocksToOpaque",
    "LiftThreadBinding",
    "ManifestSharedMemoryLocalStage",
    "CompactBufferAllocation",
    "LowerAutoCopy",
    "UnifyThreadBinding",
    "LowerMatchBuffer",
    "StmtSimplify",
    "LowerOpaqueBlock",
]

# Constant allocations up to this many bytes live on the stack (TVM's kMaxStackAlloca).
MAX_STACK_BYTES = 1024

DTYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16",
}

BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Mod": "mod",
    "FloorDiv": "floordiv", "FloorMod": "floormod", "Min": "min", "Max": "max",
    "EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge",
    "And": "and", "Or": "or", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor", "LShift": "shift_left", "RShift": "shift_right",
}

# TIR intrinsics (`tirx.<name>`) that are kiln intrinsics or operations of the same name.
INTRINSICS = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
    "sigmoid": "sigmoid", "pow": "pow", "fabs": "abs", "floor": "floor", "ceil": "ceil",
    "round": "round", "erf": "erf", "fma": "fma", "trunc": "trunc", "nearbyint": "nearbyint",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "atan2": "atan2", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh",
    "atanh": "atanh", "log2": "log2", "log10": "log10", "log1p": "log1p", "exp2": "exp2",
    "exp10": "exp10", "expm1": "expm1", "hypot": "hypot", "copysign": "copysign",
    "isnan": "isnan", "isinf": "isinf", "isfinite": "isfinite", "clz": "clz",
    "popcount": "popcount", "bitwise_not": "bitwise_not",
}
# Intrinsics that are binary operations in kiln's IR.
INTRINSIC_BINARY = {
    "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
    "shift_left": "shift_left", "shift_right": "shift_right",
}

FOR_KINDS = {
    "SERIAL": "serial", "PARALLEL": "parallel", "VECTORIZED": "vectorized",
    "UNROLLED": "unrolled", "THREAD_BINDING": "thread_binding",
}
THREADS = {"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z"}


from .errors import BridgeError  # noqa: E402  (re-exported: `kiln.bridge.BridgeError`)
from . import sort  # noqa: E402  (TVM's CPU sorts, written as kiln loops)


def _script(node):
    try:
        text = node.script()
    except Exception:  # noqa: BLE001 - printing is best effort
        text = str(node)
    text = text.strip()
    return text if len(text) < 600 else text[:600] + " ..."


def _kind_name(node):
    return type(node).__name__


def lower(mod_or_func):
    """TVM's own lowering of `mod_or_func` (an IRModule or PrimFunc): `PASSES`, no vectors."""
    if isinstance(mod_or_func, tirx.PrimFunc):
        name = "main"
        if mod_or_func.attrs is not None and "global_symbol" in mod_or_func.attrs:
            name = str(mod_or_func.attrs["global_symbol"])
        mod = tvm.IRModule({name: mod_or_func})
    elif isinstance(mod_or_func, tvm.IRModule):
        mod = mod_or_func
    else:
        raise BridgeError(
            f"to_kiln expects a tvm.IRModule or a tirx.PrimFunc, found {type(mod_or_func).__name__}"
        )
    seq = tvm.ir.transform.Sequential([getattr(s_tir.transform, p)() for p in PASSES])
    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_vectorize": True}):
        return seq(mod)


def to_kiln(mod_or_func):
    """A kiln-ir/1 module (a dict, ready for `json.dump`) with one function per PrimFunc."""
    lowered = lower(mod_or_func)
    functions = []
    for gv, func in sorted(lowered.functions.items(), key=lambda kv: kv[0].name_hint):
        functions.append(convert_lowered(gv.name_hint, func))
    return {"format": "kiln-ir/1", "functions": functions}


def convert_lowered(name, func):
    """A PrimFunc that went through `lower` as one kiln function (a dict)."""
    if not isinstance(func, tirx.PrimFunc):
        raise BridgeError(f"{name}: only PrimFuncs convert, found {type(func).__name__}")
    return _Function(name, func).convert()


def _updates(store, value):
    """Whether `value` (a `Min` or `Max`) has as an operand a load of the element `store`
    writes: `acc[i] = max(acc[i], x)`, a reduction's update."""
    for x in (value.a, value.b):
        if _kind_name(x) not in ("BufferLoad", "TensorLoad"):
            continue
        buf = x.source if hasattr(x, "source") else x.buffer
        if buf.same_as(store.buffer) and len(x.indices) == len(store.indices) and all(
            tvm_ffi.structural_equal(i, j) for i, j in zip(x.indices, store.indices)
        ):
            return True
    return False


def _any_load(e, pred):
    """Whether `e` has a load (`BufferLoad`) for which `pred(load)` holds."""
    if _kind_name(e) in ("BufferLoad", "TensorLoad"):
        if pred(e):
            return True
        return any(_any_load(i, pred) for i in e.indices)
    for field in ("a", "b", "value", "condition", "true_value", "false_value", "body", "args"):
        x = getattr(e, field, None)
        items = x if isinstance(x, (list, tuple, tvm_ffi.Array)) else [x]
        if any(isinstance(y, tvm.ir.Expr) and _any_load(y, pred) for y in items):
            return True
    return False


def _gathers(e):
    """Whether `e` loads at an index that itself loads (a gather: `x[i, idx[i]]`)."""
    return _any_load(e, lambda ld: any(_any_load(i, lambda _: True) for i in ld.indices))


def _is_float(t):
    """Whether the type name `t` is a floating-point type."""
    return t.startswith(("float", "bfloat"))


def _ty(e):
    """The type name of a TIR expression (`int32`, `float32`, ...)."""
    t = getattr(e, "ty", None)
    if t is None:
        t = getattr(e, "dtype", None)
    return str(t)




class _Function:
    def __init__(self, name, func):
        self.name = name
        self.func = func
        self.names = {}  # handle of a Var -> kiln name
        self.buffers = {}  # handle of a buffer object -> kiln buffer name
        self.keep = []  # the nodes whose handles are keys, kept alive so handles stay unique
        # (kiln variable, dtype, TIR expression, what): a buffer parameter's dimension that TIR
        # gives as an expression (`n + 3`), bound to a variable of its own and checked on entry.
        self.shape_checks = []
        self.taken = set()
        self.path = [name]

    # ----- naming ---------------------------------------------------------------------------

    def fresh(self, hint):
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in str(hint)) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, k = base, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def bind_var(self, v):
        n = self.fresh(v.name)
        self.keep.append(v)
        self.names[v.__chandle__()] = n
        return n

    def var_name(self, v):
        n = self.names.get(v.__chandle__())
        if n is None:
            raise self.error(v, f"variable `{v.name}` is used where it is not bound")
        return n

    def dt(self, d):
        s = str(d)
        if s not in DTYPES:
            raise BridgeError(
                f"{self.name}: type `{s}` has no kiln equivalent (vector and {s} values are not "
                f"converted) at {'.'.join(self.path)}"
            )
        return s

    def error(self, node, why):
        return BridgeError(
            f"{self.name}: {why} at {'.'.join(self.path)} ({_kind_name(node)}): {_script(node)}"
        )

    def at(self, field, f, *args):
        self.path.append(field)
        try:
            return f(*args)
        finally:
            self.path.pop()

    # ----- function -------------------------------------------------------------------------

    def convert(self):
        f = self.func
        params = []
        for k, p in enumerate(f.params):
            params.append(self.at(f"params[{k}]", self.param, p))
        attrs = {"global_symbol": self.name}
        if f.attrs is not None:
            if "global_symbol" in f.attrs:
                attrs["global_symbol"] = str(f.attrs["global_symbol"])
            if "tirx.noalias" in f.attrs and bool(f.attrs["tirx.noalias"]):
                attrs["noalias"] = True
            if "tirx.is_host_func" in f.attrs and bool(f.attrs["tirx.is_host_func"]):
                attrs["host"] = True  # runs on the host in a device target's module
        body = self.at("body", self.stmt, f.body)
        if self.shape_checks:
            # As TVM's packed API does: the dimension is read from the caller's tensor, then
            # compared with the expression of the other parameters' dimensions.
            checks = [{
                "stmt": "assert",
                "cond": {"op": "eq", "args": [{"var": v}, self.at(what, self.expr, e)]},
                "message": f"`{what}` must be `{e}`, by the other arguments' shapes",
            } for v, _, e, what in self.shape_checks]
            body = {"stmt": "seq", "stmts": checks + [body]}
        out = {"name": self.name, "params": params, "attrs": attrs, "body": body}
        return out

    def is_buffer(self, p):
        # A scalar parameter is a Var of a primitive type; a buffer parameter's type is not.
        return not isinstance(getattr(p, "ty", None), tvm.ir.PrimType)

    def param(self, p):
        if self.is_buffer(p):
            # A symbolic element offset (`offset_factor`) only says the caller's tensor may start
            # anywhere (`byte_offset`), which kiln's argument decoding adds to `data`; one the
            # body reads is an unbound variable below, and a constant one is refused.
            eo = p.elem_offset
            if isinstance(eo, tirx.IntImm) and int(eo.value) != 0:
                raise self.error(p, "a buffer parameter with a constant element offset is not converted")
            name = self.fresh(p.name)
            self.keep.append(p)
            self.buffers[p.__chandle__()] = name
            out = {"kind": "buffer", "name": name, "dtype": self.dt(p.dtype)}
            out["shape"] = [self.at(f"shape[{d}]", self.shape_entry, e, f"{p.name}.shape[{d}]")
                            for d, e in enumerate(p.shape)]
            if len(p.strides) > 0:
                out["strides"] = [self.at(f"strides[{d}]", self.shape_entry, e) for d, e in enumerate(p.strides)]
            return out
        name = self.bind_var(p)
        return {"kind": "scalar", "name": name, "dtype": self.dt(_ty(p))}

    def shape_entry(self, e, what=None):
        if isinstance(e, tirx.IntImm):
            if _ty(e) == "int64":
                return int(e.value)
            return {"const": int(e.value), "dtype": _ty(e)}
        if isinstance(e, tirx.Var):
            h = e.__chandle__()
            if h in self.names:
                return {"var": self.names[h], "dtype": _ty(e)}
            return {"var": self.bind_var(e), "dtype": _ty(e)}
        if what is not None and _ty(e) in ("int32", "int64"):
            # An expression of other dimensions (`concat`'s `n + 3`): a variable of its own,
            # checked against the expression on entry (`shape_checks`).
            v = self.fresh(what.replace(".shape[", "_dim").rstrip("]"))
            self.shape_checks.append((v, _ty(e), e, what))
            return {"var": v, "dtype": _ty(e)}
        raise self.error(e, "a buffer parameter's strides must be constants and variables")

    # ----- statements -----------------------------------------------------------------------

    def stmt(self, s):
        k = _kind_name(s)
        if k == "SeqStmt":
            return self.seq(list(s.seq), 0)
        if k in ("AllocBuffer", "DeclBuffer", "LetStmt", "Bind"):
            return self.seq([s], 0)
        if k == "For":
            return self.loop(s)
        if k == "BufferStore":
            k_value = _kind_name(s.value)
            if k_value in ("Min", "Max") and _updates(s, s.value):
                # `acc = max(acc, x)`: a reduction, in kiln's `max` (see `minmax`).
                value = self.at("value", self.binary, k_value, s.value)
            else:
                value = self.at("value", self.expr, s.value)
            return {
                "stmt": "store",
                "buffer": self.buffer_ref(s.buffer, s),
                "indices": [self.at(f"indices[{i}]", self.expr, e) for i, e in enumerate(s.indices)],
                "value": value,
            }
        if k == "IfThenElse":
            out = {
                "stmt": "if",
                "cond": self.at("condition", self.expr, s.condition),
                "then": self.at("then_case", self.stmt, s.then_case),
            }
            if s.else_case is not None:
                out["else"] = self.at("else_case", self.stmt, s.else_case)
            return out
        if k == "While":
            return {
                "stmt": "while",
                "cond": self.at("condition", self.expr, s.condition),
                "body": self.at("body", self.stmt, s.body),
            }
        if k == "Evaluate":
            v = s.value
            if (_kind_name(v) == "Call" and str(v.op.name).endswith("tvm_call_packed")
                    and _kind_name(v.args[0]) == "StringImm" and str(v.args[0].value) in sort.OPS):
                # TVM's CPU sorts call its C++ runtime; kiln writes the sort as loops.
                return self.at("value", sort.convert, self, v)
            return {"stmt": "evaluate", "value": self.at("value", self.expr, s.value)}
        if k == "AssertStmt":
            msg = s.message.value if hasattr(s.message, "value") else str(s.message)
            out = {"stmt": "assert", "cond": self.at("condition", self.expr, s.condition), "message": str(msg)}
            if hasattr(s, "body") and s.body is not None:
                return {"stmt": "seq", "stmts": [out, self.at("body", self.stmt, s.body)]}
            return out
        if k == "AttrStmt":
            # Annotations that do not change what the code computes. `pragma_scope` ("seq") is
            # TVMScript's IRBuilder `seq_scope()`, which only groups statements (TOPI's
            # scatter_elements, scatter_nd, index_put).
            if str(s.attr_key) in (
                "pragma_auto_unroll_max_step",
                "pragma_unroll_explicit",
                "storage_alignment",
                "pragma_scope",
            ):
                return self.at("body", self.stmt, s.body)
            raise self.error(s, f"attribute `{s.attr_key}` is not converted")
        raise self.error(s, f"statement {k} is not converted")

    def seq(self, items, start):
        """`items[start:]` as one statement; a scoping statement takes the rest as its body."""
        out = []
        for i in range(start, len(items)):
            s = items[i]
            k = _kind_name(s)
            self.path.append(f"seq[{i}]")
            try:
                if k in ("AllocBuffer", "DeclBuffer", "LetStmt", "Bind"):
                    body_stmt = getattr(s, "body", None)
                    rest = (lambda: self.at("body", self.stmt, body_stmt)) if body_stmt is not None else (
                        lambda: self.seq(items, i + 1)
                    )
                    out.append(self.scoped(s, k, rest))
                    break
                out.append(self.stmt(s))
            finally:
                self.path.pop()
        if len(out) == 1:
            return out[0]
        return {"stmt": "seq", "stmts": out}

    def scoped(self, s, k, rest):
        if k in ("LetStmt", "Bind"):
            value = self.at("value", self.expr, s.value)
            name = self.bind_var(s.var)
            return {
                "stmt": "let",
                "var": {"name": name, "dtype": self.dt(_ty(s.var))},
                "value": value,
                "body": rest(),
            }
        b = s.buffer
        h = b.__chandle__()
        self.keep.append(b)
        if k == "DeclBuffer" and h in self.buffers:
            raise self.error(s, "a DeclBuffer viewing another buffer's data is not converted")
        name = self.fresh(b.name)
        self.buffers[h] = name
        shape = []
        nbytes = tvm.DataType(str(b.dtype)).bits // 8 or 1
        const = True
        for d, e in enumerate(b.shape):
            shape.append(self.at(f"buffer.shape[{d}]", self.expr, e))
            if isinstance(e, tirx.IntImm):
                nbytes *= int(e.value)
            else:
                const = False
        scope = str(b.scope())
        if scope in ("global", ""):
            kscope = "local" if const and nbytes <= MAX_STACK_BYTES else "workspace"
        elif scope in ("local", "shared"):
            kscope = scope
        else:
            raise self.error(s, f"storage scope `{scope}` is not converted")
        return {
            "stmt": "allocate",
            "buffer": {"name": name, "dtype": self.dt(b.dtype), "shape": shape, "scope": kscope},
            "body": rest(),
        }

    def loop(self, s):
        kind = str(s.kind).split(".")[-1]
        if kind not in FOR_KINDS:
            kind = {0: "SERIAL", 1: "PARALLEL", 2: "VECTORIZED", 3: "UNROLLED", 4: "THREAD_BINDING"}.get(
                int(s.kind) if not isinstance(s.kind, str) else -1, kind
            )
        if kind not in FOR_KINDS:
            raise self.error(s, f"loop kind `{s.kind}` is not converted")
        step = getattr(s, "step", None)
        if step is not None and not (isinstance(step, tirx.IntImm) and int(step.value) == 1):
            raise self.error(s, "loops with a step other than 1 are not converted")
        mn = self.at("min", self.expr, s.min)
        ext = self.at("extent", self.expr, s.extent)
        name = self.bind_var(s.loop_var)
        out = {
            "stmt": "for",
            "var": {"name": name, "dtype": self.dt(_ty(s.loop_var))},
            "min": mn,
            "extent": ext,
            "kind": FOR_KINDS[kind],
        }
        if kind == "THREAD_BINDING":
            tag = str(s.thread_binding.thread_tag) if s.thread_binding is not None else ""
            if tag not in THREADS:
                raise self.error(s, f"thread tag `{tag}` is not converted")
            out["thread"] = tag
        out["body"] = self.at("body", self.stmt, s.body)
        return out

    def buffer_ref(self, b, node):
        n = self.buffers.get(b.__chandle__())
        if n is None:
            raise self.error(node, f"buffer `{b.name}` is used where it is not declared")
        return n

    # ----- expressions ----------------------------------------------------------------------

    def expr(self, e):
        k = _kind_name(e)
        if k == "IntImm":
            d = self.dt(_ty(e))
            if d == "bool":
                return {"const": bool(e.value), "dtype": "bool"}
            return {"const": int(e.value), "dtype": d}
        if k == "FloatImm":
            v = float(e.value)
            if math.isnan(v):
                v = "nan"
            elif math.isinf(v):
                v = "inf" if v > 0 else "-inf"
            return {"const": v, "dtype": self.dt(_ty(e))}
        if k in ("Var", "SizeVar"):
            return {"var": self.var_name(e)}
        if k in ("BufferLoad", "TensorLoad"):
            # TVM 0.27 prints buffer loads as `TensorLoad`, whose buffer is `source`.
            buf = e.source if hasattr(e, "source") else e.buffer
            return {
                "op": "load",
                "buffer": self.buffer_ref(buf, e),
                "indices": [self.at(f"indices[{i}]", self.expr, x) for i, x in enumerate(e.indices)],
            }
        if k == "Cast":
            to = self.dt(_ty(e))
            cast = {"op": "cast", "dtype": to, "args": [self.at("value", self.expr, e.value)]}
            if _is_float(_ty(e.value)) and to.startswith(("int", "uint")):
                # TVM's float -> integer conversion is C's: a value out of range has no defined
                # result there. kiln's unsaturated cast gives some value of the type instead
                # (never undefined behaviour), at TVM's cost: one instruction on x86.
                cast["saturate"] = False
            return cast
        if k in ("Min", "Max") and _is_float(_ty(e)):
            return self.minmax(k, e)
        if k in BINARY:
            return self.binary(k, e)
        if k == "Not":
            return {"op": "not", "args": [self.at("a", self.expr, e.a)]}
        if k == "Select":
            # An arm that loads at an index read from memory (`nll_loss`: `target[n] != ignore
            # ? pred[n, target[n]] : 0`) is only valid where the condition chose it: TVM's
            # select loads it anyway, out of bounds; kiln checks such an index and raises, so
            # the arms are guarded (`if_then_else` evaluates one).
            guarded = _gathers(e.true_value) or _gathers(e.false_value)
            return {
                "op": "if_then_else" if guarded else "select",
                "args": [
                    self.at("condition", self.expr, e.condition),
                    self.at("true_value", self.expr, e.true_value),
                    self.at("false_value", self.expr, e.false_value),
                ],
            }
        if k == "Let":
            value = self.at("value", self.expr, e.value)
            name = self.bind_var(e.var)
            return {
                "op": "let",
                "var": {"name": name, "dtype": self.dt(_ty(e.var))},
                "value": value,
                "body": self.at("body", self.expr, e.body),
            }
        if k == "Call":
            return self.call(e)
        raise self.error(e, f"expression {k} is not converted")

    def binary(self, k, e):
        """The TIR binary operation `e` of kind `k` as kiln's operation of `BINARY`."""
        return {"op": BINARY[k], "args": [self.at("a", self.expr, e.a), self.at("b", self.expr, e.b)]}

    def minmax(self, k, e):
        """A float `max(a, b)` (`min`) as TVM's LLVM backend writes it: `a > b ? a : b`
        (`a < b ? a : b`), so that a NaN or a signed zero gives TVM's result (`max(NaN, 1)` is
        1, `max(1, NaN)` NaN, `max(-0.0, 0.0)` is `0.0`, `max(0.0, -0.0)` is `-0.0`): one
        `vmaxps` on x86. kiln's own `max` returns NaN for any NaN and orders `-0.0` below
        `0.0`. A reduction's update (`acc = max(acc, x)`, a buffer stored with the `max` of its
        own value) stays kiln's `max`, which kiln reduces in any order, in lanes or across
        threads, with one result; TVM's differs with the order where a NaN comes in."""
        a = self.at("a", self.expr, e.a)
        b = self.at("b", self.expr, e.b)
        dtype = self.dt(_ty(e))
        binds = []

        def named(x, part):
            # An operand more than a variable, a constant or a load is computed once.
            if "var" in x or "const" in x or x.get("op") == "load":
                return x
            name = self.fresh(f"{k.lower()}_{part}")
            binds.append((name, x))
            return {"var": name}

        a, b = named(a, "a"), named(b, "b")
        out = {"op": "select", "args": [{"op": "gt" if k == "Max" else "lt", "args": [a, b]}, a, b]}
        for name, x in reversed(binds):
            out = {"op": "let", "var": {"name": name, "dtype": dtype}, "value": x, "body": out}
        return out

    def tanh_as_tvm_lowers_it(self, dtype, x):
        """`tanh(x)` as TVM's LLVM backend legalizes `tir.tanh` (its `LowerIntrin` rule):
        `x >= 0 ? (1 - exp(-2x)) / (1 + exp(-2x)) : (exp(2x) - 1) / (exp(2x) + 1)`, so kiln's
        build of a TVM function computes TVM's formula (with kiln's `exp`, within an ulp or two
        of TVM's), faster than TVM (libm's `tanh` per element was 2.9x TVM's time). kiln's own
        `tanh` intrinsic keeps libm's accuracy.

        Written with one `exp`, with the two-`exp` form's value bit for bit: `e = exp(-2 |x|)` is the very `exp` each arm takes (`-2 |x|` is
        `-2x` for `x >= 0` and `2x` below, exactly), and the second arm is `0 - (1 - e) / (1 +
        e)`: in round-to-nearest `e - 1` is exactly `-(1 - e)` and the quotient's sign follows,
        and `0 -` gives the `+0` TVM's arm gives where `e` is 1. NaN stays NaN. Each `exp` is
        an inline polynomial in kiln's code, so TVM's two (both arms are computed for a
        lane-wise select) cost twice the time and twice the code: the LSTM cell's `tanh`
        function took 27 ms of the model's build."""
        d = self.dt(dtype)
        name, e_name, t_name = self.fresh("tanh_x"), self.fresh("exp_neg2abs"), self.fresh("tanh_pos")
        v, e, t = {"var": name}, {"var": e_name}, {"var": t_name}

        def c(x):
            return {"const": x, "dtype": d}

        def op(o, *a):
            return {"op": o, "args": list(a)}

        def let(var, value, body):
            return {"op": "let", "var": {"name": var, "dtype": d}, "value": value, "body": body}

        return let(
            name,
            x,
            let(
                e_name,
                op("exp", op("mul", c(-2.0), op("abs", v))),
                let(
                    t_name,
                    op("div", op("sub", c(1.0), e), op("add", c(1.0), e)),
                    op("select", op("ge", v, c(0.0)), t, op("sub", c(0.0), t)),
                ),
            ),
        )

    def call(self, e):
        op = e.op.name if hasattr(e.op, "name") else str(e.op)
        short = op.split(".", 1)[1] if op.startswith(("tirx.", "prim.", "tir.")) else op
        args = lambda: [self.at(f"args[{i}]", self.expr, a) for i, a in enumerate(e.args)]  # noqa: E731
        if short == "if_then_else":
            return {"op": "if_then_else", "args": args()}
        if short == "likely":
            return self.at("args[0]", self.expr, e.args[0])
        if short == "reinterpret":
            return {"op": "reinterpret", "dtype": self.dt(_ty(e)), "args": args()}
        if short in INTRINSIC_BINARY:
            return {"op": INTRINSIC_BINARY[short], "args": args()}
        if short == "tanh" and _ty(e).startswith("float"):
            return self.tanh_as_tvm_lowers_it(_ty(e), args()[0])
        if short in INTRINSICS:
            return {"op": INTRINSICS[short], "args": args()}
        if short in ("call_extern", "call_pure_extern"):
            sym = e.args[0]
            if not hasattr(sym, "value"):
                raise self.error(e, "call_extern needs a constant symbol")
            rest = [self.at(f"args[{i + 1}]", self.expr, a) for i, a in enumerate(list(e.args)[1:])]
            return {"op": "call_extern", "symbol": str(sym.value), "dtype": self.dt(_ty(e)), "args": rest}
        raise self.error(e, f"call of `{op}` is not converted")
