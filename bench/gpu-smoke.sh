#!/usr/bin/env bash
# Real-GPU check of the NVML backend (issue 3). Needs a host with an NVIDIA GPU and driver,
# nvidia-ml-py, prometheus-client, aiohttp and PyYAML, and PyTorch built with CUDA for the load.
#
# Starts `gpufeed agent --gpu.backend=nvml` on 127.0.0.1:$GPU_SMOKE_PORT, runs a matmul load
# for $LOAD_SECONDS, then a waiting phase (sleeps between small launches) for $WAIT_SECONDS,
# scrapes /metrics every second, and prints per phase the mean gpufeed_gpu_utilization_ratio
# and the per-sample NVML cost (bench/gpu_smoke.py does the work).
#
# Usage: bench/gpu-smoke.sh            (PYTHON=/path/to/python to choose the interpreter)
# Exit: 0 pass, 1 the utilization did not follow the load, 2 this host cannot run the check.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${GPU_SMOKE_PORT:-19200}"
LOAD_SECONDS="${LOAD_SECONDS:-30}"
WAIT_SECONDS="${WAIT_SECONDS:-30}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD/exporter${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "gpu-smoke: $*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "nvidia-smi not found: this check needs a host with an NVIDIA GPU and its driver."
  say "(On a host without GPUs, 'make run' starts the simulated node instead.)"
  exit 2
fi
if ! nvidia-smi -L; then
  say "nvidia-smi found no working GPU (driver not loaded, or the GPU is off the bus)."
  exit 2
fi
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current --format=csv,noheader || true
# Every module the agent imports at start-up (yaml: the config reader).
for mod in pynvml prometheus_client aiohttp yaml; do
  if ! "$PYTHON" -c "import $mod" 2>/dev/null; then
    say "$PYTHON cannot import $mod (install nvidia-ml-py, prometheus-client, aiohttp, PyYAML)."
    exit 2
  fi
done
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "$PYTHON has no PyTorch with CUDA; the load phase needs it (pip install torch)."
  exit 2
fi

LOG="$(mktemp -t gpufeed-smoke-agent.XXXXXX.log)"
"$PYTHON" -m gpufeed agent --gpu.backend=nvml --web.listen-address "127.0.0.1:$PORT" \
  --log.level info >"$LOG" 2>&1 &
AGENT=$!
cleanup() {
  kill "$AGENT" 2>/dev/null || true
  wait "$AGENT" 2>/dev/null || true
}
trap cleanup EXIT

ready=0
for _ in $(seq 1 100); do
  if ! kill -0 "$AGENT" 2>/dev/null; then
    say "the agent exited before serving /metrics; its log ($LOG):"
    tail -n 20 "$LOG" >&2
    exit 2
  fi
  if "$PYTHON" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=2)" 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.2
done
if [[ "$ready" != 1 ]]; then
  say "the agent did not answer on 127.0.0.1:$PORT within 20 s; its log ($LOG):"
  tail -n 20 "$LOG" >&2
  exit 2
fi
say "agent up (pid $AGENT, log $LOG); $LOAD_SECONDS s load, then $WAIT_SECONDS s waiting"

status=0
"$PYTHON" bench/gpu_smoke.py --url "http://127.0.0.1:$PORT/metrics" \
  --load-seconds "$LOAD_SECONDS" --wait-seconds "$WAIT_SECONDS" || status=$?
say "agent log lines about the GPU backend:"
grep -i -E "gpu|nvml" "$LOG" | head -n 20 >&2 || true
exit "$status"
