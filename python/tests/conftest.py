"""pytest setup for the kiln package's tests: `python/` on the import path (so the tests run
from a clone, against the native library named by `KILN_NATIVE_LIB`, as
`python/native/tests/pytest.rs` runs them), and markers for what needs TVM."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
if os.environ.get("KILN_TEST_INSTALLED") != "1" and PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, HERE)
