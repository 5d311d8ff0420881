"""The GEMMs of the heavy GraphSAGE against an fp32 reference, in one process (an MPS client with a share, or not).

``mps_share_numerics.py`` found the heavy model's layer-2 ``Linear`` (111,616 x 256 by 256 x 256, bf16) wrong as an MPS
client at 80 % of an H200's SMs (104 SMs seen), right at 50 %, 90 % and without MPS, fp32 right everywhere. This
script narrows it to shapes, dtypes and BLAS settings: every (rows, in, out, bias, dtype) below under the default
settings, then with ``torch.backends.cuda.preferred_blas_library`` set to each library, printing one JSON line: the
SM count the process sees, each case's relative error against fp32 and the CUDA kernels it ran::

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80 python scripts/diagnostics/mps_share_gemm.py --tag share80
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

ROWS = (1024, 13312, 111616, 504832)
WIDTHS = ((100, 256), (256, 256), (256, 47))
BAD = 0.02


def kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:100] for e in prof.events() if e.device_type.name == "CUDA"})


def cases(dtype: torch.dtype, with_kernels: bool) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for m in ROWS:
        for k, n in WIDTHS:
            a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
            w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(dtype)
            b = torch.randn(n, device="cuda", generator=g).to(dtype)
            for bias in (False, True):
                ref = F.linear(a.float(), w.float(), b.float() if bias else None)
                out = F.linear(a, w, b if bias else None).float()
                err = float((out - ref).norm() / ref.norm())
                row = {"m": m, "k": k, "n": n, "bias": bias, "rel_err": round(err, 6), "bad": err > BAD}
                if with_kernels and (err > BAD or (m, k, n) == (111616, 256, 256)):
                    row["kernels"] = kernels(lambda: F.linear(a, w, b if bias else None))
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="plain")
    parser.add_argument("--libraries", default="default,cublas,cublaslt")
    args = parser.parse_args()
    report = {"tag": args.tag, "mps_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
              "sm_count_seen": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda, "settings": {}}  # fmt: skip
    for lib in args.libraries.split(","):
        if lib != "default":
            torch.backends.cuda.preferred_blas_library(lib)
        for dtype in (torch.bfloat16, torch.float16):
            rows = cases(dtype, with_kernels=lib == "default")
            report["settings"][f"{lib}/{str(dtype)[6:]}"] = {
                "bad": [r for r in rows if r["bad"]], "worst": max(r["rel_err"] for r in rows),
                "probe": [r for r in rows if "kernels" in r]}  # fmt: skip
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
