#!/usr/bin/env bash
# Every bench issue 26 (scale across cores) asks for, in one go, for a session
# lent a 16-core machine (docs/performance.md, "Issue 26 in one page", says
# what each output answers): ../shared/tools/offline-pack orjson
# here (orjson is a runtime dependency the pack's own list lacks), then the
# device tool's run with carry [".devbench"] and
#   bash .devbench/run 'bash bench/device.sh'
# For before and after in one run, also pack the starting point:
#   mkdir -p .devbench/base && git archive 89f5582 | tar -x -C .devbench/base
# (3.5 MB; its dependencies are a subset of this tree's, already packed).
# Each bench writes its output to $OUT/<name>.txt as it goes (a run cut short
# still brings back what finished); with machine.txt and base-install.txt that
# is eight files, the most the device brings back (a ninth needs a folder, or
# its output appended to another).  At most 553 s of limits (the benches',
# and 8 s for the wake-up prices in machine.txt) and 15 s for installing the
# starting point, so that with .devbench/run's own installs (about 25 s) the
# whole stays under the device's 600 s per command.
set -u
out=${OUT:-/tmp/polyport-device-out}
mkdir -p "$out"
py=${PYTHON:-python3}

run() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: python -m bench $* (at most ${limit}s)"
  local started=$SECONDS
  # Past its limit a bench gets SIGTERM and stops its cluster and gateways
  # itself (so none loads the next bench); SIGKILL 5 s later if it hangs.
  timeout -k 5 "$limit" "$py" -m bench "$@" >"$out/$name.txt" 2>&1
  echo "exit $? after $((SECONDS - started))s" >>"$out/$name.txt"
  tail -n 25 "$out/$name.txt"
}

nproc >"$out/machine.txt"; free -g >>"$out/machine.txt"; "$py" --version >>"$out/machine.txt" 2>&1
# Which CPU, kernel and idle policy: a guest that halts an idle vCPU at once
# (guest_halt_poll_ns 0) pays more to wake it (docs/operations.md,
# "Latency at light load on virtual machines").
{ uname -r; lscpu 2>/dev/null | grep -E '^(Model name|CPU family|Model|L2|L3|Hypervisor)';
  echo "guest_halt_poll_ns: $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo none)"; } \
  >>"$out/machine.txt" 2>&1
# What one process waking another costs here, on one CPU and across two:
# the price of each hop a request makes between processes, against which
# this machine's worker-count figures read (2-vCPU VMs: 13-56 µs of CPU a
# wake-up across CPUs, docs/performance.md session 35).
timeout 8 "$py" -m bench wakeups --seconds 1 >>"$out/machine.txt" 2>&1

# The commit chain alone, fed on its socket by 2 and 4 feeder processes:
# the ceiling of one chain process on this machine, measured, not inferred;
# at planned positions (the default) and moving the head row first
# (migration 0011, docs/performance.md session 21: neutral on 2 cores, where
# the CPU is the limit; here PostgreSQL's inserts can run side by side).
run chain 40 chain --feeders 2,4 --seconds 4
POLYPORT_PLANNED_POSITIONS=false run chain-head-first 40 chain --feeders 2,4 --seconds 4
# PostgreSQL's side alone: how far each statement scales with connections.
run commits 60 commits --connections 1,4,8,16 --events 256 --seconds 3
# W1 by worker count, 32 then 256 publishers.  With the starting point packed
# (.devbench/base): the default (auto: a chain process there) beside that
# tree's gateway, installed apart and alternating with this one (`bench
# workers --baseline`).  Without it: each worker committing itself ("own",
# the design before the commit chain) beside the default.
chain=(--chain both)
if [ -d .devbench/base ]; then
  base_site=/tmp/polyport-base-site
  # At most 15 s (see the top).
  if timeout 15 "$py" -m pip install -q --no-index --no-deps --no-build-isolation \
      --no-compile --target "$base_site" .devbench/base >"$out/base-install.txt" 2>&1; then
    # Its own tree first on the path; the dependencies where this run put them.
    chain=(--chain on --baseline "env PYTHONPATH=$base_site:${PYTHONPATH:-} $base_site/bin/polyport")
  else
    echo "the baseline did not install ($out/base-install.txt): workers-32 runs without it"
  fi
fi
run workers-32 120 workers --workers 1,4,8 --protocols bson,micromsg2 --seconds 4 --repeat 1 \
  "${chain[@]}"
run workers-256 100 workers --workers 1,8 --protocols bson,micromsg2 --publishers 256 \
  --seconds 4 --repeat 1 --chain on
# The peers (raw PostgreSQL, NATS JetStream) and polyport at its best worker
# count, W1 at 32 and 256 publishers, W3's latency; the load spread over
# client processes (--client-processes defaults to one per 4 cores).
run peers-w8 185 peers --workloads w1,w3 --publishers 32,256 --seconds 4 --workers 8 \
  --protocols bson,micromsg2,rsocket,segment,res01
echo "outputs in $out"
