#!/usr/bin/env python3
"""Writes latency probes of the split-K GEMV (M <= 16) as copies of
kernels/cuda/w4a16_gemv.cuh with parts changed, for run.sh. Most probes'
outputs are wrong by design: read only their timings (run.sh exits 2 on
them). They decompose a decode layer's time (docs/benchmarks.md, forty-sixth
and fiftieth sessions); every load probe changes the kFull path (K a multiple
of 4096, G a power of two: the harness's shapes):

  probe_empty.cuh         wait, write zeros, return (the chain's launch floor)
  probe_empty_pf.cuh      the same after the weight's L2 bulk prefetch
  probe_loads.cuh         the weight and scale loads as the kernel makes them, math replaced by an XOR
  probe_loads_packed.cuh  the same loads from the block's bytes as if pre-packed in fragment order
                          (each warp instruction 512 contiguous bytes)
  probe_packed.cuh        the whole kernel on those addresses: what a pre-packed weight would take
  probe_early.cuh         the kernel with its first iterations' loads before the wait for the kernel
                          before (same outputs at M <= 3 and 8 < M <= 16; wrong in general: a weight
                          that kernel writes would be read stale, and at 4 <= M <= 8, where x's loads
                          go with the weight's, x too): what hiding the weight's latency could give
  probe_packed_early.cuh  both

  dev/cuda/w4a16_ab/probes.py OUTDIR      then e.g. MS="1 16" dev/cuda/w4a16_ab/run.sh OUTDIR/probe_packed.cuh
Fails (AssertionError) where the header no longer has the code a probe replaces.
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HEADER = (ROOT / "kernels/cuda/w4a16_gemv.cuh").read_text()

WAIT = "  prior.wait();\n  __shared__ float part[WARPS][NC * TILES * 4][32];"
EMPTY = ("  prior.wait();\n"
         "  for (int i = threadIdx.x; i < NT * M; i += WARPS * 32)\n"
         "    out[static_cast<I64>(i / NT) * N + blockIdx.x * NT + i % NT] = T(0.0f);\n"
         "  if (threadIdx.x < 100000) return;  // always: the rest stays compiled, as in the kernel\n"
         "  __shared__ float part[WARPS][NC * TILES * 4][32];")
PREFETCH = "/*prefetch_weight=*/a.G >= 128"
MATH = ("      if constexpr (kPacked) gemv_math_packed<T, kSigned, NC, NSUB, kXEarly>(f[u], wv[u], acc, k0, kin, xr);\n"
        "      else gemv_math<T, kSigned, NC, NSUB, kXEarly>(f[u], wv[u], acc, k0, kin, xr);")
XOR = ("      {\n"
       "        std::uint32_t h = __float_as_uint(f[u].s[0]);\n"
       "#pragma unroll\n"
       "        for (int sub = 0; sub < NSUB; ++sub) h ^= wv[u][sub].x ^ wv[u][sub].y ^ wv[u][sub].z ^ wv[u][sub].w;\n"
       "        acc[0][0][0] += __uint_as_float(h) * 1e-30f;\n"
       "        (void)kin, (void)kPacked;\n"
       "      }")
LOADS = "        for (int sub = 0; sub < NSUB; ++sub) wv[u][sub] = ld_stream16(wrow[sub] + static_cast<I64>(it) * 64);"
PACKED = ("        for (int sub = 0; sub < NSUB; ++sub)\n"
          "          wv[u][sub] = ld_stream16(w + static_cast<I64>(n0) * (K / 2) + (static_cast<I64>(it) * NSUB + sub) * 512 +\n"
          "                                   lane * 16);")
ISSUE_FIRST = ("#pragma unroll\n"
               "    for (int u = 0; u < (D < U ? D : U); ++u) issue(u, 0u);\n")
EARLY_WAIT = ISSUE_FIRST + "    if (base == warp * U) prior.wait();  // probe: kFull shapes, every warp's first run\n"


def replaced(text, old, new):
    assert text.count(old) == 1, f"probe anchor not found once: {old[:60]!r}"
    return text.replace(old, new)


def early(text):
    return replaced(replaced(text, WAIT, "  __shared__ float part[WARPS][NC * TILES * 4][32];"), ISSUE_FIRST, EARLY_WAIT)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    empty_pf = replaced(HEADER, WAIT, EMPTY)
    loads = replaced(HEADER, MATH, XOR)
    packed = replaced(HEADER, LOADS, PACKED)
    probes = {
        "probe_empty.cuh": replaced(empty_pf, PREFETCH, "/*prefetch_weight=*/false"),
        "probe_empty_pf.cuh": empty_pf,
        "probe_loads.cuh": loads,
        "probe_loads_packed.cuh": replaced(loads, LOADS, PACKED),
        "probe_packed.cuh": packed,
        "probe_early.cuh": early(HEADER),
        "probe_packed_early.cuh": early(packed),
    }
    for name, text in probes.items():
        (out / name).write_text(text)
        print(out / name)


if __name__ == "__main__":
    main()
