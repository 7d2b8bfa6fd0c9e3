#!/usr/bin/env bash
# The real-GPU truth check of the NVML backend (issue 15), about two minutes on one GPU.
#
# Starts `gpufeed agent --gpu.backend=nvml` on 127.0.0.1 port 0 (its state and SDK socket
# in a temporary directory, never /var/lib or /run) and reads the port the kernel gave it from
# its own sockets (tests/procports.py), then bench/gpu_smoke.py runs the phases (idle,
# matmuls, one-thread kernels, pinned PCIe copies, a 32 GiB allocation) beside
# `nvidia-smi -lms 500` and a raw NVML reader, and prints one PASS/FAIL/SKIP line per check.
#
# Needs: an NVIDIA GPU and driver, nvidia-smi, a Python with torch built for CUDA and
# nvidia-ml-py (what a CUDA image has), plus the agent's runtime dependencies (aiohttp,
# prometheus-client, PyYAML, psutil, opentelemetry-sdk and -exporter-otlp-proto-http). Where
# those are missing, `pip install .` in this repository brings them, or, on a machine without
# network, wheels carried in a folder: WHEELS=/path/to/wheels installs them with
# `pip install --no-index --target` into a temporary directory first.
#
# Usage: bench/gpu-smoke.sh [OUTDIR]     (PYTHON=... picks the interpreter; default python3,
#                                         or .venv/bin/python when it has torch with CUDA)
# Writes OUTDIR (default $OUT or ./gpu-smoke-out): truth.txt, agent.jsonl, nvidia-smi.csv,
# nvml.jsonl, phases.json, agent.log.
# Exit: 0 every check PASS or SKIP, 1 a check FAILed, 2 this host cannot run the check.
set -euo pipefail
cd "$(dirname "$0")/.."

OUTDIR="${1:-${OUT:-gpu-smoke-out}}"
mkdir -p "$OUTDIR"
say() { echo "gpu-smoke: $*" >&2; }

if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PYTHON=.venv/bin/python
  fi
fi
WORK="$(mktemp -d -t gpufeed-smoke.XXXXXX)"
if [[ -n "${WHEELS:-}" ]]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/exporter${PYTHONPATH:+:$PYTHONPATH}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "nvidia-smi not found: this check needs a host with an NVIDIA GPU and its driver."
  exit 2
fi
if ! nvidia-smi -L; then
  say "nvidia-smi found no working GPU (driver not loaded, or the GPU is off the bus)."
  exit 2
fi
for mod in pynvml prometheus_client aiohttp yaml psutil opentelemetry.sdk; do
  if ! "$PYTHON" -c "import $mod" 2>/dev/null; then
    say "$PYTHON cannot import $mod (pip install . here, or WHEELS=dir of wheels)."
    exit 2
  fi
done
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "$PYTHON has no PyTorch with CUDA; the load phases need it."
  exit 2
fi

cat >"$WORK/agent.yaml" <<EOF
correlator:
  windows_log: $WORK/windows.jsonl
sdk:
  socket_path: $WORK/sdk.sock
EOF
LOG="$OUTDIR/agent.log"
"$PYTHON" -m gpufeed agent --gpu.backend=nvml --config "$WORK/agent.yaml" \
  --web.listen-address "127.0.0.1:0" --log.level info >"$LOG" 2>&1 &
AGENT=$!
cleanup() {
  kill "$AGENT" 2>/dev/null || true
  wait "$AGENT" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The port the kernel gave the agent, read from the agent's own sockets: a port chosen here
# and handed over could be taken by another process in between, and then the check would
# measure someone else's server.
if ! PORT="$("$PYTHON" tests/procports.py "$AGENT" 30)"; then
  say "the agent did not listen; its log ($LOG):"
  tail -n 20 "$LOG" >&2
  exit 2
fi
ready=0
for _ in $(seq 1 150); do
  if ! kill -0 "$AGENT" 2>/dev/null; then
    say "the agent exited before serving /metrics; its log ($LOG):"
    tail -n 20 "$LOG" >&2
    exit 2
  fi
  if "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=2)" 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.2
done
if [[ "$ready" != 1 ]]; then
  say "the agent did not answer on 127.0.0.1:$PORT within 30 s; its log ($LOG):"
  tail -n 20 "$LOG" >&2
  exit 2
fi
say "agent up (pid $AGENT, port $PORT, log $LOG)"

status=0
"$PYTHON" -m bench.gpu_smoke --url "http://127.0.0.1:$PORT/metrics" --out "$OUTDIR" \
  --agent-log "$LOG" ${GPU_SMOKE_ARGS:-} || status=$?
if ! kill -0 "$AGENT" 2>/dev/null; then
  say "the agent died during the check; its log: $LOG"
  status=1
fi
exit "$status"
