"""Build script for lightning-zerocopy's compiled extension (the project's metadata is in ``pyproject.toml``).

One extension, ``lightning_zerocopy._C``, holds every op of the ``zerocopy`` torch library:

* CPU kernels are always built (``csrc/library.cpp``, ``csrc/ops/*.cpp``, ``csrc/ops/cpu/*.cpp``).
* CUDA kernels (``csrc/ops/cuda/**/*.cu`` raw-pointer kernels plus ``csrc/ops/cuda/**/*.cpp`` torch glue; an op with
  several files, like the sampler, has a folder of its own) are built
  when the installed torch has CUDA and ``nvcc`` is found, or when ``FORCE_CUDA=1``; ``FORCE_CPU=1`` skips them.
  Target GPUs: ``TORCH_CUDA_ARCH_LIST`` when set (torch reads it), else :data:`DEFAULT_ARCH_FLAGS`.

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
#: nvcc targets when TORCH_CUDA_ARCH_LIST is unset: Ampere and Hopper SASS, plus Hopper PTX that newer GPUs JIT.
#: Passed as flags (torch adds no arch flags of its own when the nvcc flags name one), so the environment is
#: left as it is.
DEFAULT_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in {"1", "true", "yes", "on"}


def _want_cuda() -> bool:
    if _flag("FORCE_CPU"):
        return False
    if _flag("FORCE_CUDA"):
        return True
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def _sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _extension():
    with_cuda = _want_cuda()
    sources = _sources("csrc/*.cpp") + _sources("csrc/ops/*.cpp") + _sources("csrc/ops/cpu/*.cpp")
    define_macros = [("ZEROCOPY_TORCH_VERSION", f'"{torch.__version__}"')]
    cxx = ["-O3", "-std=c++20", "-fopenmp" if sys.platform != "darwin" else "-O3"]
    extra_link = ["-fopenmp"] if sys.platform != "darwin" else []
    if with_cuda:
        sources += _sources("csrc/ops/cuda/**/*.cpp") + _sources("csrc/ops/cuda/**/*.cu")
        define_macros.append(("ZEROCOPY_WITH_CUDA", "1"))
        nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            nvcc += DEFAULT_ARCH_FLAGS
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
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
    zip_safe=False,
)
