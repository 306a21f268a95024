"""A PEP 517 build backend for the `kiln` Python package, kept in the repository so that
`pip install .` needs nothing but cargo and a C compiler (and LLVM 14, as kiln does).

`build_wheel` runs `cargo build --release -p kiln-python`, then writes one wheel holding
`python/kiln/*.py` (and `*.cc`, the C++ source `kiln.tvm` compiles) and the library as `kiln/_libkiln.so` (debug info stripped when `strip` is
on PATH), tagged `py3-none-<platform>`: the library has no Python ABI (it is a tvm-ffi module
that `tvm_ffi.load_module` loads), so one wheel serves every Python 3. `build_editable` puts the
library into `python/kiln/` and installs a `.pth` file pointing at `python/`.
`build_sdist` packs the files git tracks.

Environment: `CARGO` (default `cargo`), `KILN_CARGO_ARGS` (extra arguments for cargo build).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "python" / "kiln"
LIBRARY = "_libkiln.so"


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the build requirement in pyproject.toml
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _dist_name(project: dict) -> str:
    return f"{project['name'].replace('-', '_')}-{project['version']}"


def _metadata(project: dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"License: {project['license']['text']}",
        f"Requires-Python: {project['requires-python']}",
    ]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    readme = ROOT / project.get("readme", "")
    body = readme.read_text() if readme.is_file() else ""
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(project: dict) -> str:
    scripts = project.get("scripts", {})
    if not scripts:
        return ""
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _build_native() -> Path:
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo) is None:
        raise RuntimeError(
            f"building kiln needs Rust's cargo (`{cargo}` is not on PATH): install Rust "
            "(https://rustup.rs), LLVM 14 and a C compiler, as the README says"
        )
    cmd = [cargo, "build", "--release", "-p", "kiln-python"]
    cmd += shlex.split(os.environ.get("KILN_CARGO_ARGS", ""))
    print("kiln: " + " ".join(cmd), file=sys.stderr, flush=True)
    # cargo's progress goes to stderr, which pip shows with -v.
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=sys.stderr)
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target_dir.is_absolute():
        target_dir = ROOT / target_dir
    lib = target_dir / "release" / "libkiln_python.so"
    if not lib.is_file():
        raise RuntimeError(f"cargo finished but {lib} is missing")
    return lib


def _copy_library(lib: Path, dst: Path) -> None:
    shutil.copyfile(lib, dst)
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-debug", str(dst)], check=True)
    os.chmod(dst, 0o755)


class _Wheel:
    def __init__(self, path: Path, dist_info: str):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.dist_info = dist_info
        self.records: list[str] = []

    def add(self, arcname: str, data: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if executable else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self) -> None:
        record = f"{self.dist_info}/RECORD"
        self.records.append(f"{record},,")
        self.zip.writestr(record, "\n".join(self.records) + "\n")
        self.zip.close()


def _write_wheel(wheel_directory: str, files: list[tuple[str, bytes, bool]]) -> str:
    project = _project()
    dist = _dist_name(project)
    tag = f"py3-none-{_platform_tag()}"
    name = f"{dist}-{tag}.whl"
    dist_info = f"{dist}.dist-info"
    wheel = _Wheel(Path(wheel_directory) / name, dist_info)
    for arcname, data, executable in files:
        wheel.add(arcname, data, executable)
    wheel.add(f"{dist_info}/METADATA", _metadata(project).encode())
    wheel.add(
        f"{dist_info}/WHEEL",
        (
            "Wheel-Version: 1.0\nGenerator: kiln_build_backend\nRoot-Is-Purelib: false\n"
            f"Tag: {tag}\n"
        ).encode(),
    )
    entry_points = _entry_points(project)
    if entry_points:
        wheel.add(f"{dist_info}/entry_points.txt", entry_points.encode())
    wheel.close()
    return name


def _python_files() -> list[tuple[str, bytes, bool]]:
    out = []
    # The .py modules, and the C++ source kiln.tvm compiles against the installed TVM.
    for p in sorted([*PACKAGE_DIR.glob("*.py"), *PACKAGE_DIR.glob("*.cc")]):
        out.append((f"kiln/{p.name}", p.read_bytes(), False))
    return out


# ---- PEP 517 hooks ----------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lib = _build_native()
    with tempfile.TemporaryDirectory() as tmp:
        stripped = Path(tmp) / LIBRARY
        _copy_library(lib, stripped)
        files = _python_files() + [(f"kiln/{LIBRARY}", stripped.read_bytes(), True)]
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    lib = _build_native()
    _copy_library(lib, PACKAGE_DIR / LIBRARY)
    pth = (str(ROOT / "python") + "\n").encode()
    return _write_wheel(wheel_directory, [("kiln_editable.pth", pth, False)])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    dist = _dist_name(project)
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    name = f"{dist}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        for f in files:
            if f:
                rel = f.decode()
                tar.add(ROOT / rel, arcname=f"{dist}/{rel}", recursive=False)
        meta = _metadata(project).encode()
        info = tarfile.TarInfo(f"{dist}/PKG-INFO")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
    return name
