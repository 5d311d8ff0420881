"""Build script for lightning-zerocopy.

One extension, ``lightning_zerocopy._C``, holds every op of the ``zerocopy`` torch library:

* CPU kernels are always built (``csrc/library.cpp``, ``csrc/ops/*.cpp``, ``csrc/ops/cpu/*.cpp``).
* CUDA kernels (``csrc/ops/cuda/*.cu`` raw-pointer kernels plus ``csrc/ops/cuda/*.cpp`` torch glue) are built
  when the installed torch has CUDA and ``nvcc`` is found, or when ``FORCE_CUDA=1``; ``FORCE_CPU=1`` skips them.

Install with ``pip install --no-build-isolation -e .`` so the extension compiles against the torch that is
already installed (an isolated build would pull a different torch).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
except ImportError:  # pragma: no cover - guidance for a missing torch
    sys.exit(
        "lightning-zerocopy builds against the installed PyTorch, but `import torch` failed.\n"
        "Install torch first (CPU build: `pip install torch==2.13.0`), then "
        "`pip install --no-build-isolation -e .`"
    )

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in {"1", "true", "yes", "on"}


def _want_cuda() -> bool:
    if _flag("FORCE_CPU"):
        return False
    if _flag("FORCE_CUDA"):
        return True
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def _sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _extension():
    with_cuda = _want_cuda()
    sources = _sources("csrc/*.cpp") + _sources("csrc/ops/*.cpp") + _sources("csrc/ops/cpu/*.cpp")
    define_macros = [("ZEROCOPY_TORCH_VERSION", f'"{torch.__version__}"')]
    cxx = ["-O3", "-std=c++20", "-fopenmp" if sys.platform != "darwin" else "-O3"]
    extra_link = ["-fopenmp"] if sys.platform != "darwin" else []
    if with_cuda:
        sources += _sources("csrc/ops/cuda/*.cpp") + _sources("csrc/ops/cuda/*.cu")
        define_macros.append(("ZEROCOPY_WITH_CUDA", "1"))
        nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if not arch:
            # Hopper first; the PTX lets newer parts JIT. Override with TORCH_CUDA_ARCH_LIST.
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
        ext = CUDAExtension(
            "lightning_zerocopy._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            extra_link_args=extra_link,
        )
    else:
        ext = CppExtension(
            "lightning_zerocopy._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx},
            extra_link_args=extra_link,
        )
    print(
        f"lightning-zerocopy: building _C with {'CPU + CUDA' if with_cuda else 'CPU only'} kernels "
        f"against torch {torch.__version__} ({len(sources)} sources)",
        flush=True,
    )
    return ext


setup(
    name="lightning-zerocopy",
    version="0.1.0",
    description="Zero-copy, pipelined mini-batch GNN training for PyTorch Lightning and PyG",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(ROOT, "README.md"))
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["lightning_zerocopy", "lightning_zerocopy.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
    install_requires=[
        "torch>=2.4",
        "torch-geometric>=2.5",
        "pytorch-lightning>=2.2",
        "torchmetrics>=1.0",
        "jsonargparse[signatures]>=4.27",
        "pybind11>=2.10",
        "numpy",
        "tqdm",
    ],
    extras_require={"test": ["pytest>=7", "scipy", "matplotlib>=3.7"], "bench": ["matplotlib>=3.7"]},
    entry_points={"console_scripts": ["lightning-zerocopy=lightning_zerocopy.cli:main"]},
    zip_safe=False,
)
