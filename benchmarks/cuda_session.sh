#!/usr/bin/env bash
# A lent GPU used in one call of the device tool (at most 10 minutes a call, and few minutes in all): what needs
# an idle GPU first, then what only needs a GPU, side by side, until $SESSION_END seconds from the start (default 530;
# give the call about 60 s more for the runs to stop and the archive to be written).
#   1. benchmarks/kernels.py alone on the GPU: the per-key prior kernel (kernels.json), then the low-rank prefix
#      prior and value-gate kernels (kernels_lowrank.json; the prior's kernel also with the tiles $LOWRANK_BLOCKS,
#      default "32x32", with the backward tiles $LOWRANK_BACKWARD_BLOCKS, default "64x64 64x16 128x16", and with 8
#      warps per backward program), T = 1024, 4096, 8192, bfloat16; each file is rewritten after every length, so a
#      timeout keeps what was measured.
#   Then benchmarks/attention_layer.py, alone too: the layer of every variant on the dilution page in bfloat16 at
#      T = 2048 against the raw-SDPA layer (attention_layer_dilution_bf16.json); then the whole low-rank magnitude
#      layers (the solve plus the attention) at T = 4096, B = 4, H = 12 in bfloat16 against the same reference, with
#      each layer's 15 costliest GPU kernels of one fwd+bwd call (--profile 15: where the solve's time goes;
#      attention_layer_magnitude_4096_bf16.json); then the layer on backend 'flex' at T = 2048: standard and
#      SSMax, a softcap, ALiBi (attention_layer_flex_bf16.json, a list of the three runs).
#   2. At once, until the end: the GPU tests one file group after another (the Triton kernels' tests, FlexAttention's
#      gradients, tests/test_cuda.py; tests.log), and every comparison named as an argument, each in its own
#      benchmarks/cuda_grids.sh. An argument is NAME[=SOURCE][@JOBS][+VARIANT,...]: NAME's experiment preset with
#      JOBS runs at a time (default $GRID_JOBS or 6); with =SOURCE, the finished standard runs of results/SOURCE/
#      are copied into NAME's run directory first (for a part whose preset reuses an earlier part's standard runs);
#      with +VARIANT,..., only those variants (the baseline first), so a grid too big for one call runs in parts
#      (`attnlab compare` resumes a grid with other variants and reports the union).
#      A comparison may also be a sweep, NAME:KEY=V1,V2,...[@JOBS][+VARIANT,...], as cuda_grids.sh takes it.
#   BENCH=0 skips step 1, for a call that only runs tests and comparisons; BENCH="lowrank dilution" runs only those of
#   its parts (perkey, lowrank, dilution, magnitude, flex: the five groups above, in that order); "compiled" beside
#   "magnitude" times those layers also under torch.compile (--compile: a compiled row after each eager one in the
#   same file; how many of the solve's launches compilation removes).
# What comes back (the device returns at most 8 files): machine.txt, kernels.json, kernels_lowrank.json,
# attention_layer_dilution_bf16.json, attention_layer_magnitude_4096_bf16.json, attention_layer_flex_bf16.json,
# tests.log and, with comparisons, grids.tgz (every run without its checkpoints, and grids.log, each comparison's
# output: unpack it here, then `attnlab report DIR --export results/NAME`).
#     bash benchmarks/cuda_session.sh "$OUT" hijack-v2-6=hijack-v2-1-h100@10 dilution-mqar-3=dilution-mqar-1@5
cd "$(dirname "$0")/.."
DEST="${1:-${OUT:-cuda-out}}"; [ $# -gt 0 ] && shift; mkdir -p "$DEST"
END="${SESSION_END:-530}"; WORK="${GRID_WORK:-/tmp/grids}"
source benchmarks/cuda_env.sh  # wheels from .whl/, PYTHONPATH, stamp
left() { echo $(( END - ($(date +%s) - t0) )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch,sys,triton;print(sys.version, torch.__version__, torch.version.cuda, triton.__version__)"
  nproc; } > "$DEST/machine.txt" 2>&1
BENCH="${BENCH:-1}"; [ "$BENCH" = 1 ] && BENCH="perkey lowrank dilution magnitude flex"
part() { [[ " $BENCH " == *" $1 "* ]]; }  # BENCH=0: no benchmarks, the whole time to the tests and the comparisons
for family in perkey lowrank; do
  part $family || continue
  stamp "kernels.py $family"; file="$DEST/kernels.json"; [ $family = lowrank ] && file="$DEST/kernels_lowrank.json"
  extra=""; [ $family = lowrank ] && extra="--lowrank-blocks ${LOWRANK_BLOCKS:-32x32}
    --lowrank-backward-blocks ${LOWRANK_BACKWARD_BLOCKS:-64x64 64x16 128x16} --lowrank-backward-warps 8"
  timeout 150 python3 benchmarks/kernels.py --repeats 10 --families $family $extra --out "$file" > /dev/null \
    2> /tmp/$family.err
  echo "rc $?"; tail -3 /tmp/$family.err
done
if part dilution; then
stamp "attention_layer.py, the dilution page's variants"
timeout 90 python3 benchmarks/attention_layer.py --device cuda --dtype bfloat16 --seq 2048 --repeats 10 --variants \
  standard qk-norm count-prior ssmax softpick stick-breaking gated sink selective differential magnitude-prefix-logits \
  magnitude-prefix-logits-lowrank > "$DEST/attention_layer_dilution_bf16.json" 2> /tmp/layer.err; echo "rc $?"
tail -2 /tmp/layer.err
fi
if part magnitude; then  # with "compiled" too: each layer also under torch.compile, rows in the same file
compile=""; limit=90; part compiled && { compile="--compile"; limit=240; }
stamp "attention_layer.py, the low-rank magnitude layers at T = 4096 $compile"
timeout $limit python3 benchmarks/attention_layer.py --device cuda --dtype bfloat16 --seq 4096 --batch 4 --heads 12 \
  --repeats 10 --profile 15 $compile --variants standard magnitude-causal-lowrank magnitude-prefix-logits-lowrank \
  > "$DEST/attention_layer_magnitude_4096_bf16.json" 2> /tmp/layer4096.err; echo "rc $?"
tail -2 /tmp/layer4096.err
fi
if part flex; then
stamp "attention_layer.py, FlexAttention's score modifiers"
flex=(standard-ssmax "--variants standard ssmax" softcap "--softcap 30 --variants standard"
      alibi "--pos-encoding alibi --variants standard")
for ((n = 0; n < ${#flex[@]}; n += 2)); do
  timeout 60 python3 benchmarks/attention_layer.py --device cuda --dtype bfloat16 --seq 2048 --repeats 10 \
    --backend flex ${flex[n + 1]} > "/tmp/flex-${flex[n]}.json" 2> /tmp/flex.err; echo "rc $?"; tail -2 /tmp/flex.err
done
python3 -c "import json, sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:] if open(f).read().strip()],
  indent=1))" /tmp/flex-*.json > "$DEST/attention_layer_flex_bf16.json"
fi
stamp "tests and comparisons"
( for group in "tests/test_prior_kernel.py tests/test_lowrank_prior_kernel.py tests/test_lowrank_gate_kernel.py" \
               "tests/test_flex_backend.py -k cuda" "tests/test_cuda.py"; do
    limit=$(left); [ "$limit" -gt 20 ] || { echo "== no time left for $group"; continue; }
    echo "== pytest $group (limit $limit s)"
    timeout "$limit" python3 -m pytest -q -rA -p no:cacheprovider $group; echo "rc $?"
  done ) > "$DEST/tests.log" 2>&1 &
i=0
for spec in "$@"; do
  i=$((i + 1)); jobs="${GRID_JOBS:-6}"; variants=""
  [[ "$spec" == *+* ]] && { variants="${spec##*+}"; spec="${spec%+*}"; }
  [[ "$spec" == *@* ]] && { jobs="${spec##*@}"; spec="${spec%@*}"; }
  name="${spec%%=*}"
  if [[ "$spec" == *:* ]]; then name="$spec"  # NAME:KEY=V1,V2,...: a sweep, as cuda_grids.sh takes it
  elif [[ "$spec" == *=* ]]; then mkdir -p "$WORK/$name"; cp -r "results/${spec#*=}/standard" "$WORK/$name/"; fi
  limit=$(left); [ "$limit" -ge 1 ] || limit=1
  GRID_TIMEOUT=$limit GRID_JOBS="$jobs" GRID_WORK="$WORK" GRID_VARIANTS="${variants//,/ }" \
    bash benchmarks/cuda_grids.sh "$WORK.out-$i" "$name" \
    > "$WORK.log-$i" 2>&1 &
done
wait
if [ $i -gt 0 ]; then
  mkdir -p "$WORK"
  for f in "$WORK".log-* "$WORK".out-*/*.log; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done > "$WORK/grids.log"
  tar czf "$DEST/grids.tgz" -C "$WORK" --exclude=checkpoint .
fi
grep -E "^== |passed|failed|rc " "$DEST/tests.log" | tail -12
stamp done
