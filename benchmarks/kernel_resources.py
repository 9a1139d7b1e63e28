"""The compiler's resource report of attnlab's Triton kernels for a CUDA target, read without a GPU: each kernel is
compiled by Triton for the given architecture (sm_90 by default: the H100 and H200) and its cubin read by the
cuobjdump that ships with Triton. Per kernel and configuration it prints the registers per thread (255 is the
ceiling), the stack frame per thread (bytes; above 0 with 255 registers means the kernel spills registers to local
memory, which the GPU reads back through the caches), the shared memory Triton asks for, and from the kernel's SASS
the number of instructions and of MUFU instructions by function (EX2, LG2, RCP, ...: the special-function unit,
which issues a sixteenth of the FP32 rate per SM on the H100, so that each exp2, log2 or reciprocal per score costs
as much as a dozen FMAs). The counts are static: each loop body appears once, unrolled over the tile the thread owns.

Configurations: every kernel of attnlab.functional.kernels (the per-key prior's forward, dK/dV and dq kernels, and
the low-rank prefix kernels with the prior, GATE = 0, and the clamp value gate, GATE = 1) in the input dtype
--dtype, with the factors' product w = 1 - phi . c in the precision the wrappers pick for it (or each of --factors;
the factor gradients' products take the precision of q, k, v's), at each
--blocks BLOCK_MxBLOCK_N,
head dimension --head-dim, rank --rank and --num-warps; and the low-rank backward kernels alone with the (outer,
inner) tiles of each --backward-blocks OUTERxINNER (the wrappers' backward_blocks: the dK/dV kernel owns OUTER keys
and steps over INNER queries, the dq kernel the reverse). What the wrappers launch on CUDA today: blocks of 64 x 64
and 4 warps.

    python benchmarks/kernel_resources.py                                  # one JSON object
    python benchmarks/kernel_resources.py --blocks 64x64 32x32 --num-warps 4 8 --factors auto ieee
        # results/benchmarks/cuda/kernel_resources_sm90.json
    python benchmarks/kernel_resources.py --blocks --backward-blocks 64x16 64x32 128x16 --num-warps 4 8
        # results/benchmarks/cuda/kernel_resources_backward_sm90.json
Needs triton (the `kernels` extra); no GPU, and Triton's interpreter must be off (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

SCALARS = {"T", "H", "HKV", "D", "R", "GROUP", "F_DIV", "P_DIV"}  # integer arguments spelled in capitals
FLOATS = {"scale", "qk_scale2", "floor"}
IO = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}  # tensors in the input dtype; every other pointer is float32
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")  # a SASS line's opcode, after
#   its address and any predicate guard


def signature(fn, dtype: str, constexprs: dict) -> dict:
    """Triton's signature of ``fn``: a pointer type for each tensor, i32 or fp32 for each scalar."""
    out = {}
    for name in fn.arg_names:
        if name in constexprs:
            out[name] = "constexpr"
        elif name in FLOATS:
            out[name] = "fp32"
        elif name in SCALARS or not name.isupper():
            out[name] = "i32"
        else:
            out[name] = f"*{dtype}" if name in IO else "*fp32"
    return out


def resources(fn, dtype: str, constexprs: dict, arch: int, num_warps: int) -> dict:
    """{regs, stack_bytes, shared_bytes} of ``fn`` compiled for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton.compile(ASTSource(fn, signature(fn, dtype, constexprs), constexprs),
                            target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        report = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", report.split("Function", 1)[1]))
    opcodes = OPCODE.findall(sass)
    return {"regs": int(usage["REG"]), "stack_bytes": int(usage["STACK"]), "local_bytes": int(usage["LOCAL"]),
            "shared_bytes": kernel.metadata.shared, "instructions": len(opcodes),
            "mufu": dict(sorted(Counter(op[5:] for op in opcodes if op.startswith("MUFU.")).items()))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--arch", type=int, default=90, help="the CUDA compute capability, as 90 for sm_90")
    parser.add_argument("--blocks", nargs="*", default=["64x64"], help="BLOCK_MxBLOCK_N, each a power of two >= 16")
    parser.add_argument("--backward-blocks", nargs="*", default=[],
                        help="OUTERxINNER: the low-rank backward kernels alone with these (outer, inner) tiles")
    parser.add_argument("--num-warps", type=int, nargs="+", default=[4])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--factors", nargs="+", default=["auto"], choices=["auto", "ieee", "tf32", "tf32x3"],
                        help="the precision of the low-rank factors' product w = 1 - phi . c: auto (the wrappers' "
                             "choice for --dtype) or one")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("benchmarks/kernel_resources.py compiles for a GPU: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default before 3.10, as on the device
    import torch
    import triton

    from attnlab.functional.kernels import lowrank, perkey
    from attnlab.functional.kernels.common import backward_tiles, factor_precision, precision

    def fail(message):
        sys.exit(f"benchmarks/kernel_resources.py: {message}")

    torch_dtype = getattr(torch, args.dtype)
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[args.dtype]
    block_d, block_r = max(16, triton.next_power_of_2(args.head_dim)), max(16, triton.next_power_of_2(args.rank))
    rows = []

    def lowrank_kernel(name, gate, factors, block_m, block_n):
        """(row name, kernel, constexprs) of one low-rank kernel at one tile."""
        return (f"lowrank.{name}[GATE={gate}" + ("" if factors == "auto" else f", {factors}") + "]",
                getattr(lowrank, name),
                dict(GATE=gate, PRECISION=precision(torch_dtype),
                     FACTORS=factor_precision(torch_dtype) if factors == "auto" else factors,
                     BLOCK_R=block_r, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d))

    def add(kernels, warps):
        for name, fn, constexprs in kernels:
            rows.append({"kernel": name, "block_m": constexprs["BLOCK_M"], "block_n": constexprs["BLOCK_N"],
                         "num_warps": warps, **resources(fn, short, constexprs, args.arch, warps)})

    for blocks in args.blocks:
        block_m, block_n = (int(x) for x in blocks.split("x"))
        for warps in args.num_warps:
            add([(f"perkey.{name}", getattr(perkey, name),
                  dict(HAS_PRIOR=True, PRECISION=precision(torch_dtype), BLOCK_M=block_m, BLOCK_N=block_n,
                       BLOCK_D=block_d))
                 for name in ("_forward_kernel", "_dkdv_kernel", "_dq_kernel")]
                + [lowrank_kernel(name, gate, factors, block_m, block_n)
                   for factors in args.factors for gate in (0, 1)
                   for name in ("_forward_kernel", "_dkdv_kernel", "_dq_kernel")], warps)
    for blocks in args.backward_blocks:
        outer, _, inner = blocks.partition("x")
        if not (outer.isdigit() and inner.isdigit()):
            fail(f"--backward-blocks {blocks}; allowed: OUTERxINNER, as 64x16")
        tiles = backward_tiles(fail, (int(outer), int(inner)), 16, 16)  # ((dK/dV), (dq)) (BLOCK_M, BLOCK_N)
        for warps in args.num_warps:
            add([lowrank_kernel(name, gate, factors, *tile) for factors in args.factors for gate in (0, 1)
                 for name, tile in zip(("_dkdv_kernel", "_dq_kernel"), tiles)], warps)
    print(json.dumps({"arch": f"sm_{args.arch}", "dtype": args.dtype, "head_dim": args.head_dim, "rank": args.rank,
                      "triton": triton.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
