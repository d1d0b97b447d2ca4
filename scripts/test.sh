#!/usr/bin/env bash
# The test command: installs what it needs, then runs every tier pytest can run here.
# As root it also installs the system packages the cluster tier needs (sshd, ip, iptables, ...)
# and a C compiler for the fused mHC loops (auralm/kernels).
#   bash scripts/test.sh [--fast] [PYTEST ARGS...]
# --fast: only what needs no lab and no real training run (pytest -m "not cluster and not slow").
# The suite without a selection of yours (no test path, -m, -k), in two phases:
#   1. every test but those marked `alone`, on four pytest processes (pytest-xdist, a file's tests together so that
#      its fixtures are made once; the cluster tier's each on a lab of its own): four on two cores, since many tests
#      wait (for a lab's timeouts, a rank's missed beats, a node's answer) and the others keep the cores busy meanwhile.
#      Files are handed out in their collection order (tests/cluster, tests/trainer, tests/unit: the long ones first,
#      the many short ones last to fill the cores at the end), not xdist's default of the files with the most tests
#      first, which left the cluster tier's few long tests (test_memory_cap's three: over a minute) to the end;
#   2. the tests marked `alone` (they compare CPU shares and delays), one at a time with nothing beside.
# The elastic tests (tests/cluster/test_elastic*.py) mostly wait, for a node's 60 s faults and for paced steps: each
# test runs from the start beside phase 1, in a process and on a lab of its own, and phase 2 waits for them.
# The lab nodes' venv is made (once a machine) beside the install of .venv, before any phase.
# With a selection: one pytest, as given.
set -uo pipefail
cd "$(dirname "$0")/.."
fast=0 chosen=0 args=()
for a in "$@"; do
  case "$a" in
    --fast) fast=1 ;;
    -m|-k|-m?*|-k?*|-n|-n?*|--lf|--last-failed|--ff|--failed-first|*::*) chosen=1; args+=("$a") ;;
    -*) args+=("$a") ;;
    *) if [ -e "$a" ]; then chosen=1; fi; args+=("$a") ;;  # a test path
  esac
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for tool in sshd:openssh-server ssh-keygen:openssh-client ip:iproute2 iptables:iptables tc:iproute2 \
              faketime:faketime rsync:rsync cc:gcc ping:iputils-ping runuser:util-linux pkill:procps git:git tmux:tmux \
              munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
    command -v "${tool%%:*}" >/dev/null || [ -x "/usr/sbin/${tool%%:*}" ] || need+=("${tool##*:}")
  done
  /usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null || { echo "apt-get install ${need[*]} failed"; exit 1; }
  fi
fi
node_venv_pid=""
if [ $fast = 0 ] && [ $chosen = 0 ] && [ "$(id -u)" = 0 ] && [ -x /usr/bin/python3 ]; then
  # the lab nodes' venv (torch and the rest: lab/nodes.py ensure_node_venv), made beside the install below, on the
  # core that install leaves idle, rather than by the first lab while the tests keep both cores busy; a test that
  # needs it meanwhile waits on its lock. Made once a machine (a fresh machine's CI makes it here)
  node_venv_log=$(mktemp)
  /usr/bin/python3 -c "from lab.nodes import ensure_node_venv; ensure_node_venv()" >"$node_venv_log" 2>&1 &
  node_venv_pid=$!
fi
bash scripts/install.sh test || exit 1  # with the test extras (training installs none)
# bytecode for our own modules once, here: the suite starts about two thousand Python processes, which with
# PYTHONDONTWRITEBYTECODE set would each compile what they import again (0.1 s of CPU apiece)
.venv/bin/python -m compileall -q -j 2 auralm cli netcheck lab tests bench >/dev/null || true
# torch's OpenMP threads wait for work without spinning: with several test processes on two cores, libgomp's default
# spin (300,000 turns after each parallel region) burns the core the other process needs. Phase 1 on this machine,
# 2026-11-28: 408, 405 and 419 s (730-762 CPU-s) by default, 380 and 393 s (684-708 CPU-s) with PASSIVE.
# It reaches this script's processes and what they start here (local runs, srun's steps); an SSH lab node's ranks get
# the launcher's environment only (one thread each there)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
pytest() {  # exit code 5 (no test collected) is a failure
  .venv/bin/python -m pytest "$@"
  local rc=$?
  if [ $rc -eq 5 ]; then echo "pytest collected no tests: that is a failure"; return 1; fi
  return $rc
}
if [ $fast = 1 ]; then
  pytest -m "not cluster and not slow" --ignore=tests/cluster -n 2 --dist loadfile ${args[@]+"${args[@]}"}
elif [ $chosen = 1 ]; then
  pytest ${args[@]+"${args[@]}"}
else
  elastic_files=(tests/cluster/test_elastic.py tests/cluster/test_elastic_diloco.py) elastic_tests=() elastic_logs=()
  elastic_pids=()
  for file in "${elastic_files[@]}"; do
    for name in $(grep -o '^def test_[A-Za-z0-9_]*' "$file" | cut -c5-); do elastic_tests+=("$file::$name"); done
  done
  for test in "${elastic_tests[@]}"; do
    log=$(mktemp)
    pytest -m cluster -p no:cacheprovider ${args[@]+"${args[@]}"} "$test" >"$log" 2>&1 &
    elastic_pids+=($!) elastic_logs+=("$log")
  done
  pytest -m "not alone" -n 4 --dist loadfile --no-loadscope-reorder --durations=30 ${args[@]+"${args[@]}"} "${elastic_files[@]/#/--ignore=}" tests
  rc=$?
  rc_elastic=0
  for i in "${!elastic_pids[@]}"; do
    wait "${elastic_pids[$i]}" || rc_elastic=$?
    echo "--- ${elastic_tests[$i]} (run beside the first phase):"
    cat "${elastic_logs[$i]}"
    rm -f "${elastic_logs[$i]}"
  done
  pytest -m "cluster and alone" ${args[@]+"${args[@]}"} tests/cluster  # with nothing beside it
  rc_alone=$?
  if [ -n "$node_venv_pid" ]; then
    wait "$node_venv_pid" || { echo "--- the lab nodes' venv could not be made beside the install (each lab tried" \
                                    "again):"; cat "$node_venv_log"; }
    rm -f "$node_venv_log"
  fi
  for r in $rc $rc_elastic $rc_alone; do [ "$r" = 0 ] || exit "$r"; done
  exit 0
fi
