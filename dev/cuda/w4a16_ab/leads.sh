#!/usr/bin/env bash
# Leads for the W4A16 decode GEMV at M = 1 (issue #14 item 4), kept as patches
# of kernels/cuda/w4a16_gemv.cuh (leads/*.patch; docs/benchmarks.md, the
# sixty-fourth session's section, says what each is and what was measured).
# Each entry is applied to a copy of the working tree's header and timed by
# run.sh as A against the tree as B, with the weights in pack_w4a16's
# fragment order; run.sh compares A's outputs with B's bit for bit (probes
# differ by design). An entry PATCH[+PATCH...][:NAME=VALUE] applies its
# patches in order and defines NAME as VALUE at the top of A (e.g.
# resident_v1.patch:QGRAD_RESIDENT_TILES=2; a probe is a patch on top of the
# lead it probes: resident_v1.patch+probe_nomath_on_v1.patch).
#   dev/cuda/w4a16_ab/leads.sh [ENTRY ...]    (default: the list below; MS as run.sh, default 1)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
entries=("$@")
[ ${#entries[@]} -gt 0 ] || entries=(resident_v1.patch resident_v1.patch:QGRAD_RESIDENT_XCOPY=0
                                     resident_v1.patch:QGRAD_RESIDENT_XCOPY=2 resident_v1.patch:QGRAD_RESIDENT_TILES=2
                                     resident_v0.patch resident_v1.patch+probe_nomath_on_v1.patch)
status=0
for entry in "${entries[@]}"; do
  patches=${entry%%:*}
  define=""
  [ "$entry" = "$patches" ] || define=${entry#*:}
  name=${patches//.patch/}${define:+_${define//=/_}}
  header=$work/$name.cuh
  { [ -z "$define" ] || echo "#define ${define/=/ }"; cat "$root/kernels/cuda/w4a16_gemv.cuh"; } > "$header"
  applied=1
  IFS=+ read -r -a list <<< "$patches"
  for patch_file in "${list[@]}"; do
    patch -s --no-backup-if-mismatch "$header" < "$here/leads/$patch_file" || { applied=0; break; }
  done
  if [ $applied = 0 ]; then
    echo "== $name: $patch_file does not apply to the tree's header"
    status=1
    continue
  fi
  echo "== $name (a) against the tree (b)"
  QGRAD_AB_FRAG=1 MS="${MS:-1}" "$here/run.sh" "$header" || status=$?
done
exit $status
