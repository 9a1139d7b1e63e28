#!/usr/bin/env bash
# The comparisons a GPU session runs, each bounded: the named experiment presets (default: hijack-v2-1 and hijack-v2-2)
# with --jobs $GRID_JOBS (default 3) on the one GPU, then each exported without checkpoints (compare.toml, every run's config, metrics and
# summary, the report) to $DEST/<experiment>/, ready to commit as results/<experiment>/. A grid cut off by its
# timeout keeps its finished runs; the export reports the rest as missing. Missing pure-Python dependencies can travel
# as wheels in .whl/, as for cuda_session.sh.
#     bash benchmarks/cuda_grids.sh "$OUT" hijack-v2-1 hijack-v2-2
cd "$(dirname "$0")/.."
DEST="${1:-${OUT:-cuda-out}}"; [ $# -gt 0 ] && shift; mkdir -p "$DEST"
GRIDS=("$@"); [ ${#GRIDS[@]} -eq 0 ] && GRIDS=(hijack-v2-1 hijack-v2-2)
LIMIT="${GRID_TIMEOUT:-240}"  # seconds per grid
JOBS="${GRID_JOBS:-3}"; DEVICE="${GRID_DEVICE:-cuda}"  # GRID_DEVICE=cpu tries the script out without a GPU
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 ATTNLAB_CACHE=/tmp/attnlab-cache MPLBACKEND=Agg
attnlab() { python3 -c "import sys; from attnlab.cli import main; sys.exit(main())" "$@"; }
t0=$(date +%s); stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$DEST/machine.txt" 2>&1
for grid in "${GRIDS[@]}"; do
  stamp "$grid"
  # SIGINT at the limit: every run saves a checkpoint and the compare writes its report of what finished
  timeout -s INT -k 30 "$LIMIT" bash -c "$(declare -f attnlab); attnlab compare --experiment $grid --jobs $JOBS \
    --out-dir /tmp/grids/$grid train.device=$DEVICE" > "$DEST/$grid.log" 2>&1
  echo "rc $?" >> "$DEST/$grid.log"; tail -3 "$DEST/$grid.log"
  attnlab report "/tmp/grids/$grid" --export "$DEST/$grid" > /dev/null 2>> "$DEST/$grid.log"
done
stamp done
