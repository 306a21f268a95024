"""Which devices the package's tests can use: OpenCL through kiln (PoCL in CI)."""

import os

import pytest

import kiln


def opencl_or_skip():
    """Skips the test without an OpenCL device, unless `KILN_REQUIRE_OPENCL=1` (CI), where
    that is a failure."""
    backends = {b["name"]: b for b in kiln.devices()["backends"]}
    if not backends.get("opencl", {}).get("devices"):
        if os.environ.get("KILN_REQUIRE_OPENCL") == "1":
            raise AssertionError("KILN_REQUIRE_OPENCL=1 but kiln sees no OpenCL device")
        pytest.skip("no OpenCL device (install PoCL: pocl-opencl-icd)")
