#!/usr/bin/env bash
# The GPU extras as wheels, for a GPU host that cannot reach a package registry (docs/perf-log/2026-12-02.md's runs).
#
#   bash scripts/gpu_host_wheels.sh fetch DIR     # here, with registry access: DIR gets every wheel
#   WITH_FA3=1 bash scripts/gpu_host_wheels.sh fetch DIR   # and FA3's FP8 forward, the opt-in
#   bash scripts/gpu_host_wheels.sh install DIR   # there: installs them, then prints the PYTHONPATH to export
#
# The host brings its own torch and triton; this adds diffusers and torchao (requirements.txt's pins) and
# requirements-gpu.txt's GPU pins, each with the pieces pip would have pulled in and the host lacks.
# Two things a plain `pip install --target` gets wrong here, and why this script exists:
# - CuTe DSL 4.8 (nvidia-cutlass-dsl, which flash-attn-4 and QuACK run on) is split into three wheels: libs-base,
#   libs-cu13 and libs-core, the last holding `cutlass.cute`. Without it both libraries fail to import and the
#   engine falls back to cuDNN's SDPA and cuBLAS (an Edge T2V step 239.7 ms instead of 209.8, docs/perf-log/2026-12-02.md);
# - the three share one package folder, so they are unpacked into it one after another (pip --target skips or
#   replaces a folder that exists), and the `.pth` file that puts `dsl_packages` on sys.path is not read from a
#   PYTHONPATH entry, so that folder goes on PYTHONPATH too.
# QuACK builds its epilogue GEMMs only from a folder named site-packages (cosmos3_kernels/gemm.py), hence the target's name.
set -euo pipefail
what=${1:?fetch or install}; dir=${2:?a folder for the wheels}
python_version=${PYTHON_VERSION:-3.12}  # the GPU host's Python
root=$(cd "$(dirname "$0")/.." && pwd)

pin() {  # NAME's pinned version in requirements FILE (the one place each version lives)
  sed -n "s/^$2\(\[[^]]*\]\)\?==\([^ ]*\).*/\2/p" "$root/$1" | head -n 1 | grep . \
    || { echo "no $2==VERSION line in $1" >&2; exit 1; }
}

case $what in
fetch)
  cutlass=$(pin requirements-gpu.txt nvidia-cutlass-dsl)
  wheels=(
    "diffusers==$(pin requirements.txt diffusers)" "torchao==$(pin requirements.txt torchao)"
  )
  for name in flash-attn-4 quack-kernels nvidia-cudnn-frontend mslk-cuda; do
    wheels+=("$name==$(pin requirements-gpu.txt "$name")")
  done
  # FA3's FP8 forward is an opt-in (requirements-gpu.txt says why): WITH_FA3=1 takes the version named there.
  if [ "${WITH_FA3:-0}" = 1 ]; then
    wheels+=("fa3-fwd==$(sed -n 's/^#   pip install fa3-fwd==\([^ ]*\).*/\1/p' "$root/requirements-gpu.txt" | grep .)")
  fi
  # CuTe DSL's three parts at its pinned version, and two pieces flash-attn-4 and QuACK need that the host lacks
  # (not pinned by this project: the versions these runs used).
  wheels+=("nvidia-cutlass-dsl==$cutlass" "nvidia-cutlass-dsl-libs-base==$cutlass" "nvidia-cutlass-dsl-libs-cu13==$cutlass"
           "nvidia-cutlass-dsl-libs-core==$cutlass" apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
  mkdir -p "$dir"
  for wheel in "${wheels[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dir" "$wheel"
  done
  ls -la "$dir"
  ;;
install)
  target=${TARGET:-/tmp/py/site-packages}
  mkdir -p "$target"
  shopt -s nullglob
  separate=("$dir"/nvidia_cutlass_dsl_libs_*.whl)
  rest=()
  for wheel in "$dir"/*.whl; do
    case $wheel in */nvidia_cutlass_dsl_libs_*) ;; *) rest+=("$wheel") ;; esac
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "${rest[@]}"
  for wheel in "${separate[@]}"; do  # unpacked into the shared folder, one after another
    python3 -m zipfile -e "$wheel" "$target"
  done
  # Byte-compiled as pip does by default (skipped above to compile once, after the unpacking): without it every
  # new process compiled the libraries' sources again, ~2-5 s of a restarted process's first request (measured).
  python3 -m compileall -q -j 0 "$target" >/dev/null
  echo "export PYTHONPATH=$target:$target/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
  ;;
*)
  echo "usage: $0 fetch|install DIR" >&2; exit 2 ;;
esac
