#!/usr/bin/env python3
"""Writes latency probes of the split-K GEMV (M <= 16) as copies of
kernels/cuda/w4a16_gemv.cuh with parts changed, for run.sh. Most probes'
outputs are wrong by design: read only their timings (run.sh exits 2 on
them). They decompose a decode layer's time (docs/benchmarks.md, forty-sixth,
fiftieth and fifty-first sessions); the load probes change the kFull path (K
a multiple of 4096, G a power of two: the harness's shapes):

  probe_empty.cuh         wait, write zeros, return (the chain's launch floor)
  probe_empty_pf.cuh      the same after the weight's L2 bulk prefetch
  probe_loads.cuh         the weight and scale loads as the kernel makes them, math replaced by an XOR
  probe_early.cuh         one tile a warp (M <= 3) with the plain order's first loads before the wait
                          for the kernel before, as the fragment order's are (same outputs here; wrong
                          in general: a weight that kernel writes would be read stale)

The fragment order itself (pack_w4a16; its loads before the wait are safe)
runs with QGRAD_AB_FRAG=1 in run.sh's environment (main.cu packs the weights).

  dev/cuda/w4a16_ab/probes.py OUTDIR      then e.g. MS="1 16" dev/cuda/w4a16_ab/run.sh OUTDIR/probe_loads.cuh
Fails (AssertionError) where the header no longer has the code a probe replaces.
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HEADER = (ROOT / "kernels/cuda/w4a16_gemv.cuh").read_text()

WAIT = "  if constexpr (!kEarly) prior.wait();\n  __shared__ float part[WARPS][NC * TILES * 4][32];"
EMPTY = ("  prior.wait();\n"
         "  for (int i = threadIdx.x; i < NT * M; i += WARPS * 32)\n"
         "    out[static_cast<I64>(i / NT) * N + blockIdx.x * NT + i % NT] = T(0.0f);\n"
         "  if (threadIdx.x < 100000) return;  // always: the rest stays compiled, as in the kernel\n"
         "  __shared__ float part[WARPS][NC * TILES * 4][32];")
PREFETCH = "/*prefetch_weight=*/a.G >= 128"
MATH = ("      if constexpr (kPacked) gemv_math_packed<T, kSigned, NC, NSUB, kXEarly, kFrag>(f[u], wv[u], acc, k0, kin, xr);\n"
        "      else gemv_math<T, kSigned, NC, NSUB, kXEarly, kFrag>(f[u], wv[u], acc, k0, kin, xr);")
XOR = ("      {\n"
       "        std::uint32_t h = __float_as_uint(f[u].s[0]);\n"
       "#pragma unroll\n"
       "        for (int sub = 0; sub < NSUB; ++sub) h ^= wv[u][sub].x ^ wv[u][sub].y ^ wv[u][sub].z ^ wv[u][sub].w;\n"
       "        acc[0][0][0] += __uint_as_float(h) * 1e-30f;\n"
       "        (void)kin, (void)kPacked;\n"
       "      }")
EARLY = "  constexpr bool kEarly = kFrag && TILES == 1;"


def replaced(text, old, new):
    assert text.count(old) == 1, f"probe anchor not found once: {old[:60]!r}"
    return text.replace(old, new)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    empty_pf = replaced(HEADER, WAIT, EMPTY)
    probes = {
        "probe_empty.cuh": replaced(empty_pf, PREFETCH, "/*prefetch_weight=*/false"),
        "probe_empty_pf.cuh": empty_pf,
        "probe_loads.cuh": replaced(HEADER, MATH, XOR),
        "probe_early.cuh": replaced(HEADER, EARLY, "  constexpr bool kEarly = TILES == 1;  // probe: any order"),
    }
    for name, text in probes.items():
        (out / name).write_text(text)
        print(out / name)


if __name__ == "__main__":
    main()
