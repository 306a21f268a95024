"""The TIR bridge under its old name: `kiln_tvm.to_kiln` is `kiln.to_kiln` (python/kiln/bridge.py).

Kept for scripts that put `python/` on `sys.path` and import `kiln_tvm`; new code imports
`kiln` (installed with `pip install .`, see the README).
"""

from kiln.bridge import PASSES, BridgeError, lower, to_kiln  # noqa: F401
