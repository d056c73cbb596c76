#!/usr/bin/env python3
"""Writes the latency probes of the M <= 8 split-K GEMV as copies of
kernels/cuda/w4a16_gemv.cuh with parts removed, for run.sh (their outputs are
wrong by design: read only their timings; run.sh exits 2 on them). They
decompose a decode layer's time (docs/benchmarks.md, forty-sixth session; the
load probes replace the kFull path's loads since the forty-seventh):

  probe_empty.cuh        wait, write zeros, return (the chain's launch floor)
  probe_empty_pf.cuh     the same after the weight's L2 bulk prefetch
  probe_loads.cuh        the weight and scale loads as the kernel makes them, math replaced by an XOR
  probe_loads_coal.cuh   the same loads with coalesced addresses (512 contiguous bytes a warp instruction)

  dev/cuda/w4a16_ab/probes.py OUTDIR      then e.g. MS=1 dev/cuda/w4a16_ab/run.sh OUTDIR/probe_loads.cuh
Fails (AssertionError) where the header no longer has the code a probe replaces.
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HEADER = (ROOT / "kernels/cuda/w4a16_gemv.cuh").read_text()

WAIT = "  prior.wait();\n  __shared__ float part[WARPS][4][32];"
EMPTY = ("  prior.wait();\n"
         "  if (threadIdx.x < 16 * M)\n"
         "    out[static_cast<I64>(threadIdx.x / 16) * N + blockIdx.x * 16 + threadIdx.x % 16] = T(0.0f);\n"
         "  if (threadIdx.x < 100000) return;  // always: the rest stays compiled, as in the kernel\n"
         "  __shared__ float part[WARPS][4][32];")
PREFETCH = "/*prefetch_weight=*/a.G >= 128"
MATH = "      if constexpr (kPacked) gemv_math_packed<T, kSigned, 1, 2, false>(f[u], wv[u], acc, k0, kin, xr);"
XOR = ("      if constexpr (kPacked) acc[0][0][0] += __uint_as_float(wv[u][0].x ^ wv[u][0].y ^ wv[u][0].z ^ wv[u][0].w ^"
       " wv[u][1].x ^ wv[u][1].y ^ wv[u][1].z ^ wv[u][1].w ^ __float_as_uint(f[u].s[0])) * 1e-30f;")
# The loads of the kFull path (K a multiple of 4096, as the harness's), which
# the probes time.
LOADS = ("        wv[u][0] = ld_stream16(w_lo + static_cast<I64>(it) * 64);\n"
         "        wv[u][1] = ld_stream16(w_hi + static_cast<I64>(it) * 64);")
COAL = ("        {\n"
        "          const std::uint8_t* wb = w + static_cast<I64>(n0) * (K / 2) + static_cast<I64>(it) * 1024 + lane * 16;\n"
        "          wv[u][0] = ld_stream16(wb);\n"
        "          wv[u][1] = ld_stream16(wb + 512);\n"
        "        }\n"
        "        (void)w_lo, (void)w_hi;")


def replaced(text, old, new):
    assert text.count(old) == 1, f"probe anchor not found once: {old[:60]!r}"
    return text.replace(old, new)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    empty_pf = replaced(HEADER, WAIT, EMPTY)
    loads = replaced(HEADER, MATH, XOR)
    probes = {
        "probe_empty.cuh": replaced(empty_pf, PREFETCH, "/*prefetch_weight=*/false"),
        "probe_empty_pf.cuh": empty_pf,
        "probe_loads.cuh": loads,
        "probe_loads_coal.cuh": replaced(loads, LOADS, COAL),
    }
    for name, text in probes.items():
        (out / name).write_text(text)
        print(out / name)


if __name__ == "__main__":
    main()
