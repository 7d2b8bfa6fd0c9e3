#!/bin/sh
# Slurm Epilog for gpufeed: removes the job from the job mapping directory written by
# gpufeed-prolog.sh; a GPU's file goes when no job is left in it. Install as (or call from)
# slurm.conf's Epilog=. Never fails: exits 0 whatever happens.
DIR="${GPUFEED_JOB_MAPPING_DIR:-/run/gpufeed/job-map}"
JOB="${SLURM_JOB_ID:-}"
GPUS="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}"

case "$JOB" in ''|*[!0-9A-Za-z_.-]*) exit 0 ;; esac
[ -d "$DIR" ] || exit 0

(
    command -v flock >/dev/null 2>&1 && flock -w 10 9
    # The epilog may not know the GPUs (older Slurm): then look in every file.
    if [ -n "$GPUS" ]; then
        files=$(for g in $(printf '%s' "$GPUS" | tr ',' ' '); do printf '%s\n' "$DIR/$g"; done)
    else
        files=$(ls -1 "$DIR" 2>/dev/null | sed "s|^|$DIR/|")
    fi
    for f in $files; do
        [ -f "$f" ] || continue
        case "$(basename "$f")" in .*) continue ;; esac
        tmp="$DIR/.$(basename "$f").$JOB.tmp"
        grep -vxF "$JOB" "$f" >"$tmp" 2>/dev/null
        if [ -s "$tmp" ]; then
            chmod 0644 "$tmp" && mv -f "$tmp" "$f"
        else
            rm -f "$f"
        fi
        rm -f "$tmp"
    done
) 9>>"$DIR/.lock"
exit 0
