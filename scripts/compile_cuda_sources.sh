#!/usr/bin/env bash
# Compiles every CUDA kernel source (csrc/ops/cuda/**/*.cu) with nvcc, compile only, so a CUDA syntax or type
# error fails CI on machines without a GPU. Kernels take raw pointers and a cudaStream_t and include no
# torch headers, so they compile against the CUDA toolkit alone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc_bin="${NVCC:-nvcc}"
if ! command -v "$nvcc_bin" >/dev/null 2>&1; then
  echo "nvcc not found: set NVCC or install the CUDA toolkit" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
count=0
while IFS= read -r -d '' src; do
  rel="${src#"$root"/csrc/ops/cuda/}"
  echo "nvcc -c -arch=sm_90 $rel"
  "$nvcc_bin" -c -arch=sm_90 -std=c++17 -O3 -I"$root/csrc" "$src" -o "$out/${rel//\//_}.o"
  count=$((count + 1))
done < <(find "$root/csrc/ops/cuda" -name '*.cu' -print0 | LC_ALL=C sort -z)
echo "compiled $count CUDA source(s) with $("$nvcc_bin" --version | tail -1)"
