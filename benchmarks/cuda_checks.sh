#!/usr/bin/env bash
# The GPU checks and measurements in one command, each step bounded, logs and JSON under $1 (default $OUT or ./cuda-out):
#   first the Triton kernels: tests/test_prior_kernel.py, test_lowrank_prior_kernel.py and test_lowrank_gate_kernel.py
#   compiled on the GPU, and the FlexAttention backend's gradients (tests/test_flex_backend.py)
#   (float32 and bfloat16, -rA so each case is named; test_prior_kernel.log), benchmarks/kernels.py for the per-key
#   prior kernel against SDPA flash, the float mask and FlexAttention (kernels.json) and for the low-rank prefix prior
#   kernel at r = 16 against SDPA flash, the dense prior as a float mask and the PyTorch block path
#   (kernels_lowrank.json), at T = 1024, 4096, 8192 in bfloat16, with peak memory. KERNELS_ONLY=1 stops there
#   (within ten minutes). Then tests/test_cuda.py (every GPU test, -rA so each one is named), benchmarks/magnitude.py
#   --long (the long-context magnitude rows, the block form of the low-rank prefix layer included),
#   benchmarks/attention_layer.py in bfloat16 (every registered variant's layer), and a 30-step probe of training at
#   T = 1024 (the magnitude-long experiment's shape) per variant, to size a longer comparison; the block sweep of the
#   low-rank prefix layer (blocks of 64 to 512 against the explicit path, magnitude_chunks.json). Eleven files land in
#   the folder. Missing pure-Python dependencies can travel as wheels in .whl/.
#     bash benchmarks/cuda_checks.sh results/benchmarks/cuda
#     KERNELS_ONLY=1 bash benchmarks/cuda_checks.sh "$OUT"
cd "$(dirname "$0")/.."
DEST="${1:-${OUT:-cuda-out}}"; mkdir -p "$DEST"
source benchmarks/cuda_env.sh  # wheels from .whl/, PYTHONPATH, stamp
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  nproc; } > "$DEST/machine.txt" 2>&1
stamp kernel_tests
timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_prior_kernel.py tests/test_lowrank_prior_kernel.py tests/test_lowrank_gate_kernel.py \
  > "$DEST/test_prior_kernel.log" 2>&1
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_flex_backend.py -k cuda >> "$DEST/test_prior_kernel.log" 2>&1
echo "rc $?" >> "$DEST/test_prior_kernel.log"; grep -E "passed|failed|FAILED|rc " "$DEST/test_prior_kernel.log" | tail -8
stamp kernel_bench
timeout 220 python3 benchmarks/kernels.py --repeats 10 --families perkey > "$DEST/kernels.json" 2> /tmp/kernels.err
echo "rc $?"; tail -3 /tmp/kernels.err
stamp kernel_bench_lowrank
timeout 170 python3 benchmarks/kernels.py --repeats 10 --families lowrank > "$DEST/kernels_lowrank.json" \
  2> /tmp/kernels_lowrank.err
echo "rc $?"; tail -3 /tmp/kernels_lowrank.err
if [ "${KERNELS_ONLY:-0}" = 1 ]; then stamp done; exit 0; fi
stamp tests
timeout 180 python3 -m pytest -q -s -rA -p no:cacheprovider tests/test_cuda.py > "$DEST/test_cuda.log" 2>&1
echo "rc $?" >> "$DEST/test_cuda.log"; grep -E "passed|failed|FAILED|rc " "$DEST/test_cuda.log" | tail -8
stamp magnitude_long
timeout 120 python3 benchmarks/magnitude.py --long --device cuda --repeats 5 > "$DEST/magnitude_long.json" 2> /tmp/magnitude_long.err
tail -2 /tmp/magnitude_long.err
stamp chunks
rows=""; for t in 1024 2048 4096; do for c in 64 128 256 512; do rows="$rows lowrank-prefix:$t:$c"; done
  rows="$rows lowrank-prefix-explicit:$t"; done
timeout 120 python3 benchmarks/magnitude.py --device cuda --batch 1 --repeats 5 --rows $rows lowrank-causal:4096:64 \
  lowrank-causal:4096:256 > "$DEST/magnitude_chunks.json" 2> /tmp/magnitude_chunks.err; tail -1 /tmp/magnitude_chunks.err
stamp layer_bf16
timeout 90 python3 benchmarks/attention_layer.py --device cuda --dtype bfloat16 --repeats 5 > "$DEST/attention_layer_bf16.json" 2> /tmp/attention_layer_bf16.err
tail -2 /tmp/attention_layer_bf16.err
stamp probe_T1024
for v in standard magnitude-causal-lowrank magnitude-causal; do
  timeout 40 python3 -c "import sys; from attnlab.cli import main; sys.exit(main())" train --preset cpu --quiet \
    --out "/tmp/probe-$v" model.attention=$v model.block_size=1024 train.batch_size=4 train.max_steps=30 train.warmup_steps=10 \
    train.eval_interval=30 train.eval_tokens=32768 train.sample_tokens=0 train.device=cuda > "/tmp/probe-$v.log" 2>&1
  echo "rc $?" >> "/tmp/probe-$v.log"; tail -2 "/tmp/probe-$v.log"; cp "/tmp/probe-$v/summary.json" "$DEST/probe-T1024-${v}_summary.json" 2>/dev/null
done
stamp done
