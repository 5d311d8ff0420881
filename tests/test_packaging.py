"""Packaging: metadata in pyproject.toml, the version in one place, a setup.py that leaves the environment alone."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_holds_the_metadata_and_reads_the_version_from_the_package() -> None:
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["dynamic"] == ["version"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lightning_zerocopy.__version__"}
    assert "torch" in " ".join(meta["build-system"]["requires"])
    assert {m.split(":")[0] for m in meta["tool"]["pytest"]["ini_options"]["markers"]} == {"cuda", "slow", "two_gpus"}
    assert "version=" not in (ROOT / "setup.py").read_text(), "the version lives in lightning_zerocopy/__init__.py"


def test_setup_py_passes_the_default_cuda_targets_as_flags_not_through_the_environment(monkeypatch) -> None:
    import shutil

    import setuptools
    from torch.utils import cpp_extension

    nvcc = shutil.which("nvcc")
    if cpp_extension.CUDA_HOME is None and nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc) to describe a CUDA extension with")
    if cpp_extension.CUDA_HOME is None:  # a CPU torch: point it at the toolkit to describe (not build) the extension
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(Path(os.path.realpath(nvcc)).parents[1]))
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.setenv("FORCE_CUDA", "1")
    monkeypatch.delenv("FORCE_CPU", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    before = dict(os.environ)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    assert dict(os.environ) == before, "setup.py must not change the environment"
    flags = captured["ext_modules"][0].extra_compile_args["nvcc"]
    assert "-gencode=arch=compute_90,code=sm_90" in flags and "-gencode=arch=compute_90,code=compute_90" in flags
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the user's choice: torch reads it, no flags of ours
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    assert not any("arch=" in flag for flag in captured["ext_modules"][0].extra_compile_args["nvcc"])
