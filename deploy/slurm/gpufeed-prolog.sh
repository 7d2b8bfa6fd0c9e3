#!/bin/sh
# Slurm Prolog for gpufeed: records which job holds which GPU in the job mapping directory
# (the format of dcgm-exporter's --hpc-job-mapping-dir: one file per GPU index, one job id
# per line). Install as (or call from) slurm.conf's Prolog=, runs as root on the node, and
# set the same directory in gpufeed's config: `jobs: {mapping_dir: /run/gpufeed/job-map}`.
# GPUs come from SLURM_JOB_GPUS (the node's GPU indices), falling back to
# CUDA_VISIBLE_DEVICES / GPU_DEVICE_ORDINAL where the Slurm version sets those instead.
# A prolog must never fail a job for bookkeeping: every error here exits 0.
DIR="${GPUFEED_JOB_MAPPING_DIR:-/run/gpufeed/job-map}"
JOB="${SLURM_JOB_ID:-}"
GPUS="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}"

case "$JOB" in ''|*[!0-9A-Za-z_.-]*) exit 0 ;; esac
[ -n "$GPUS" ] || exit 0
mkdir -p "$DIR" 2>/dev/null && chmod 0755 "$DIR" 2>/dev/null || exit 0

(
    # Serialise with other prologs/epilogs on this node (jobs sharing a GPU).
    command -v flock >/dev/null 2>&1 && flock -w 10 9
    for gpu in $(printf '%s' "$GPUS" | tr ',' ' '); do
        case "$gpu" in ''|*[!0-9A-Za-z-]*) continue ;; esac # an index or a MIG/GPU UUID
        tmp="$DIR/.$gpu.$JOB.tmp"
        {
            [ -f "$DIR/$gpu" ] && grep -vxF "$JOB" "$DIR/$gpu"
            printf '%s\n' "$JOB"
        } >"$tmp" 2>/dev/null && chmod 0644 "$tmp" && mv -f "$tmp" "$DIR/$gpu"
        rm -f "$tmp"
    done
) 9>>"$DIR/.lock"
exit 0
