"""Configs the dev harness builds, checks and times (name -> knobs, per head dim).

Knobs = the HOPPER_* macros of kernels/hopper/instantiate.cuh:
WGS consumer warpgroups (BLOCK_M = 64*WGS), BN = BLOCK_N, ST = STAGES,
RP/RC = setmaxnreg of producer/consumers, OV = OVERLAP, PP = PINGPONG.
"""

VARIANTS = {
    # Run 1 (v1: SCHED 0 only), kept for the record:
    #   a64 WGS3 BN128 ST2 32/160 OV0 PP0   b64 = a64 + OV1   c64 = b64 + PP1
    #   d64 WGS2 BN128 ST3 24/240 OV1 PP1   e64 WGS2 BN192 ST2 24/240 OV1 PP1
    #   a128 WGS2 BN128 ST2 24/240 OV0 PP0  b128 = a128 + OV1  c128 = b128 + PP1
    #   d128 = c128 with BN176              e128 = c128 with ST3
    # Run 2 (v2: + SCHED, RESCALE_LOG2) also had c64, c64p, f64, f64p, d64, c64r, e128, c128p,
    #   g128 (BN144), g128p; see runs/run2_table.txt.
    # Run 3 also had h64r (WGS1 + RS8), f64pr (ST3), b128pr (PP0); see runs/run3_table.txt.
    # Run 4 had c64re4 / c64re2 / c64pre4 (EXP_EMU 4, 2: slower), d128r (BN176); runs/run4_table.txt.
    # Run 5 also had k64r / k64dr (BN96: slower), j128dr (BN112: slower); runs/run5_table.txt.
    # Run 6 (final, v6 = q_empty released by every consumer thread): the best of runs 1-5.
    # Run 7 (needs runs/run7_kernel.patch: `git apply` it, the knobs are not in the tree):
    #   MC = independent FMNMX chains in the row max (1 = the tree's code, 4 = the patch's default),
    #   EP = EXP_PACKED (ex2.approx.f16x2, fp16 only, dtypes=(0,)); variants c64dr1/h64_1/e128r1/
    #   c128pr1 = the run-6 configs with MC=1, c64dre/c64re/h64e/e128re/c128pre = with EP=1.
    # Run 8 (skip_tile, kernel.cuh): c64r0 / c64dr0 / c64pr0 = c64r / c64dr / c64pr (SCHED 1) built
    #   from the kernel before it (`git show 18eaf1b:kernels/hopper/kernel.cuh`), b64r = c64r with
    #   OVERLAP 0 / PINGPONG 0; see NOTES.md.
    # D = 64
    "h64": dict(D=64, WGS=1, BN=128, ST=2, RP=24, RC=256, OV=1, PP=0, SC=0),
    "c64r": dict(D=64, WGS=3, BN=128, ST=2, RP=32, RC=160, OV=1, PP=1, SC=0, RS=8),
    "c64dr": dict(D=64, WGS=3, BN=128, ST=2, RP=32, RC=160, OV=1, PP=1, SC=2, RS=8),
    # D = 128
    "e128r": dict(D=128, WGS=2, BN=128, ST=3, RP=24, RC=240, OV=1, PP=1, SC=0, RS=8),
    "c128pr": dict(D=128, WGS=2, BN=128, ST=2, RP=24, RC=240, OV=1, PP=1, SC=1, RS=8),
    "c128dr": dict(D=128, WGS=2, BN=128, ST=2, RP=24, RC=240, OV=1, PP=1, SC=2, RS=8),
}

DTYPES = {0: "fp16", 1: "bf16"}


def cubin_name(variant: str, dtype: int, causal: int) -> str:
    return f"{variant}_{DTYPES[dtype]}_c{causal}"
