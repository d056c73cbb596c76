#!/usr/bin/env bash
# Two "hosts" without a GPU: two network namespaces joined by a veth pair
# (10.77.x.1 <-> 10.77.x.2) that this script creates and removes, one rank
# in each, each started by its own qgrad-run (--nnodes 2 --node-rank K, the
# store on the first namespace's address). Runs dist_worker MODE (ddp:
# bit-identical weights across the "hosts", loss as one process).
# Needs root or CAP_NET_ADMIN and iproute2: prints SKIPPED otherwise.
#   netns_test.sh QGRAD_RUN DIST_WORKER MODE
set -u
run=$1 worker=$2 mode=$3
skip() { echo "SKIPPED: $*"; exit 0; }
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
id=$$
a=qgrad_a_$id b=qgrad_b_$id va=qva$id vb=qvb$id
net="10.77.$((id % 250 + 1))"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; true; }
trap cleanup EXIT
ip netns add "$a" 2>/dev/null || skip "cannot create a network namespace (needs root or CAP_NET_ADMIN)"
ip netns add "$b" 2>/dev/null || skip "cannot create a second network namespace"
ip link add "$va" type veth peer name "$vb" 2>/dev/null || skip "cannot create a veth pair"
ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" || skip "cannot move the veth ends"
ip -n "$a" addr add "$net.1/24" dev "$va" && ip -n "$b" addr add "$net.2/24" dev "$vb" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up && ip -n "$b" link set "$vb" up || exit 1
port=$(( 20000 + id % 40000 ))
echo "namespaces $a ($net.1) and $b ($net.2), store at $net.1:$port"
ip netns exec "$a" "$run" --nproc-per-node 1 --nnodes 2 --node-rank 0 --master-addr "$net.1" --master-port "$port" \
  "$worker" "$mode" & p0=$!
ip netns exec "$b" "$run" --nproc-per-node 1 --nnodes 2 --node-rank 1 --master-addr "$net.1" --master-port "$port" \
  "$worker" "$mode" & p1=$!
wait $p0; c0=$?
wait $p1; c1=$?
echo "host 0 exited with $c0, host 1 with $c1"
[ $c0 = 0 ] && [ $c1 = 0 ]
