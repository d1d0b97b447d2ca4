#!/usr/bin/env bash
# The test command: installs what it needs, then runs every tier pytest can run here.
# As root it also installs the system packages the cluster tier needs (sshd, ip, iptables, ...)
# and a C compiler for the fused mHC loops (auralm/kernels).
# --fast: only what needs no lab and no real training run (pytest -m "not cluster and not slow");
# every other argument goes to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = --fast ]; then args+=(-m "not cluster and not slow"); else args+=("$a"); fi
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for tool in sshd:openssh-server ssh-keygen:openssh-client ip:iproute2 iptables:iptables tc:iproute2 \
              faketime:faketime rsync:rsync cc:gcc ping:iputils-ping runuser:util-linux pkill:procps git:git tmux:tmux; do
    command -v "${tool%%:*}" >/dev/null || [ -x "/usr/sbin/${tool%%:*}" ] || need+=("${tool##*:}")
  done
  /usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null || { echo "apt-get install ${need[*]} failed"; exit 1; }
  fi
fi
bash scripts/install.sh test || exit 1  # with the test extras (training installs none)
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: that is a failure"
  exit 1
fi
exit $rc
