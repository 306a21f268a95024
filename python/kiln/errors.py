"""kiln's Python exceptions (importable without TVM).

Errors that come from kiln's Rust side arrive as the built-in exception tvm-ffi raises for
their kind: `ValueError` for a malformed target or IR, `TypeError` for arguments of the wrong
kind, `RuntimeError` for what fails to compile or run. The exceptions here are the Python
side's own.
"""


class BridgeError(NotImplementedError):
    """A TIR construct kiln's bridge does not convert yet: the message names the node, where it
    is (the path of fields from the function), and its TVMScript text. Never a wrong module."""


class UnsupportedFunctionError(BridgeError):
    """`kiln.tvm.compile` met PrimFuncs kiln cannot build and fallback was not allowed:
    `failures` maps each function's name to why (the construct, where it is)."""

    def __init__(self, message: str, failures: dict):
        super().__init__(message)
        self.failures = dict(failures)
