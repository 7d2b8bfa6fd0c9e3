#!/usr/bin/env bash
# gpufeed on a real GPU host, beyond the truth check (bench/gpu-smoke.sh): the
# busy-is-not-working check (bench/gpu_busy_waiting.py, ~5 min) and fault-lab scenarios with
# real kernels (`python -m lab.run --device cuda`, the agent on NVML; needs root, loop
# devices and cgroups, else that part is reported as not runnable and skipped).
#
# Dependencies as in bench/gpu-smoke.sh: a Python with CUDA PyTorch and nvidia-ml-py, plus the
# agent's runtime dependencies; WHEELS=/path/to/wheels installs missing ones into a temporary
# directory first (a machine without network).
#
# Usage: bench/gpu-lab.sh [OUTDIR]   LAB_SCENARIOS="name ..." (default: none), BUSY=0 skips
#        the busy check. Writes OUTDIR (default $OUT or ./gpu-lab-out): summary.txt and
#        gpu-lab.tar.gz (every run's files: traces, windows, logs, the lab report).
# Exit: 0 all checks passed, 1 one failed, 2 this host cannot run them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:-${OUT:-gpu-lab-out}}"
mkdir -p "$OUTDIR"
WORK="$(mktemp -d -t gpufeed-gpulab.XXXXXX)"
SUMMARY="$OUTDIR/summary.txt"
say() { echo "gpu-lab: $*" | tee -a "$SUMMARY" >&2; }
PYTHON="${PYTHON:-python3}"
if [[ -n "${WHEELS:-}" ]]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" "$WHEELS"/*.whl || { say "installing the wheels failed"; exit 2; }
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/exporter:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

say "host: $(uname -r), uid $(id -u), $(nvidia-smi -L 2>&1 | head -1)"
say "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
say "python: $("$PYTHON" -c 'import sys,torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())' 2>&1 | tail -1)"
say "cgroups: $(awk '$3 ~ /cgroup/ {print $3":"$2}' /proc/mounts | tr '\n' ' ')"
say "loop: $(command -v losetup mkfs.ext4 | tr '\n' ' ') $(losetup -f 2>&1)"

status=0
RUN="$WORK/runs"
mkdir -p "$RUN"
if [[ "${BUSY:-1}" != 0 ]]; then
  say "busy-is-not-working check"
  "$PYTHON" -m bench.gpu_busy_waiting --out "$RUN/busy" 2>&1 | tee -a "$SUMMARY"
  rc=${PIPESTATUS[0]}
  say "busy check exit $rc"
  [[ $rc == 0 ]] || status=1
fi
if [[ -n "${LAB_SCENARIOS:-}" ]]; then
  # shellcheck disable=SC2086 # a list of names
  timeout "${LAB_TIMEOUT:-400}" "$PYTHON" -m lab.run $LAB_SCENARIOS --launcher "${LAB_LAUNCHER:-run}" \
    --device cuda --nice 0 --out "$RUN/lab" 2>&1 | tee -a "$SUMMARY"
  rc=${PIPESTATUS[0]}
  say "lab exit $rc"
  [[ $rc == 0 ]] || status=1
fi
tar -C "$RUN" -czf "$OUTDIR/gpu-lab.tar.gz" . 2>/dev/null || say "could not pack the runs"
rm -rf "$WORK"
exit "$status"
