"""The `<!-- pytest -->` blocks of docs/python.md run, in order, in one scratch directory, with
`EXAMPLES` (the repository's examples/kernels) defined: the guide's examples cannot rot."""

import os
import re
from pathlib import Path

import pytest

import kiln  # noqa: F401  (imported here, before the chdir: KILN_NATIVE_LIB may be relative)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "python.md"


def blocks():
    text = GUIDE.read_text()
    out = []
    for m in re.finditer(r"<!-- pytest -->\n```python\n(.*?)\n```", text, re.S):
        line = text[: m.start()].count("\n") + 2
        out.append((line, m.group(1)))
    return out


def test_the_guide_has_pytest_blocks():
    assert len(blocks()) >= 3


def test_guide_blocks_run(tmp_path, capsys):
    needs_tvm = any("import tvm" in code for _, code in blocks())
    if needs_tvm:
        pytest.importorskip("tvm")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for line, code in blocks():
            scope = {"EXAMPLES": ROOT / "examples" / "kernels", "__name__": "__guide__"}
            try:
                exec(compile(code, f"{GUIDE}:{line}", "exec"), scope)
            except Exception as e:
                raise AssertionError(f"docs/python.md block at line {line} failed: {e!r}") from e
    finally:
        os.chdir(cwd)
