#!/usr/bin/env bash
# Comparisons on one GPU, each bounded by $GRID_TIMEOUT seconds (default 240):
#   NAME                  the experiment preset NAME with --jobs $GRID_JOBS (default 3) on the one GPU;
#   NAME:KEY=V1,V2,...    NAME's sweep of KEY: one comparison per value, all values at once (each with
#                         $GRID_JOBS jobs), in the layout `attnlab sweep` writes (NAME-sweep/KEY=VALUE/).
# Every run is then copied without checkpoints into one archive, $DEST/grids.tgz (the device returns few, shallow
# files: unpack it here, then `attnlab report DIR --export results/NAME` per comparison, or `attnlab report
# NAME-sweep` for a sweep); $DEST/<grid>.log holds each grid's output. A grid cut off by its timeout keeps its
# finished runs (SIGINT: each run saves a checkpoint and is marked interrupted). Missing pure-Python dependencies
# can travel as wheels in .whl/, as for cuda_checks.sh.
#     bash benchmarks/cuda_grids.sh "$OUT" hijack-v2-1 hijack-v2-2 zoology-mqar-t64-d64:train.lr=1e-3,3.16e-3,1e-2
cd "$(dirname "$0")/.."
DEST="${1:-${OUT:-cuda-out}}"; [ $# -gt 0 ] && shift; mkdir -p "$DEST"
GRIDS=("$@"); [ ${#GRIDS[@]} -eq 0 ] && GRIDS=(hijack-v2-1 hijack-v2-2)
LIMIT="${GRID_TIMEOUT:-240}"  # seconds per grid
JOBS="${GRID_JOBS:-3}"; DEVICE="${GRID_DEVICE:-cuda}"  # GRID_DEVICE=cpu tries the script out without a GPU
VARIANTS="${GRID_VARIANTS:+--variants $GRID_VARIANTS}"  # GRID_VARIANTS="standard qk-norm": those variants only
WORK="${GRID_WORK:-/tmp/grids}"
source benchmarks/cuda_env.sh  # wheels from .whl/, PYTHONPATH, stamp
attnlab() { python3 -c "import sys; from attnlab.cli import main; sys.exit(main())" "$@"; }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$DEST/machine.txt" 2>&1
bounded() {  # SIGINT at the limit: every run saves a checkpoint and the compare reports what finished
  timeout -s INT -k 30 "$LIMIT" bash -c "$(declare -f attnlab); attnlab $*"
}
for grid in "${GRIDS[@]}"; do
  stamp "$grid"; name="${grid%%:*}"; log="$DEST/${grid//[^A-Za-z0-9._=-]/_}.log"
  if [[ "$grid" == *:* ]]; then
    setting="${grid#*:}"; key="${setting%%=*}"; IFS=, read -ra values <<< "${setting#*=}"
    for value in "${values[@]}"; do
      { bounded compare --experiment "$name" $VARIANTS --jobs "$JOBS" --out-dir "$WORK/$name-sweep/$key=$value" \
          "$key=$value" train.device="$DEVICE"; echo "$key=$value: rc $?"; } > "$log.$value" 2>&1 &
    done
    wait; cat "$log".* > "$log"; rm -f "$log".*
    attnlab report "$WORK/$name-sweep" > /dev/null 2>> "$log"
  else
    bounded compare --experiment "$name" $VARIANTS --jobs "$JOBS" --out-dir "$WORK/$name" train.device="$DEVICE" \
      > "$log" 2>&1
    echo "rc $?" >> "$log"
  fi
  tail -3 "$log"
done
tar czf "$DEST/grids.tgz" -C "$WORK" --exclude=checkpoint .
stamp done
