#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (run as root):
#   apt packages -> kernel headers link for BCC -> bpffs -> .venv with the project.
# Every step checks before it acts, so a second run is quick and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3-bpfcc bpfcc-tools python3-venv python3-dev linux-headers-amd64
  iptables ipset nftables bird2 etcd-server etcd-client iproute2 procps kmod
  ruby # ruby: `ruby -c` checks the Vagrantfile in tests
  nginx wrk sockperf iperf3 # real traffic between lab pods (pyfelix bench dataplane-compare)
  gcc # the C traffic generators (pyfelix/bench/c: bench services, the flow-log flood test)
  python3-matplotlib) # bench charts (make bench), seen through the venv's system site-packages

log() { printf '[setup] %s\n' "$*"; }

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  log "installing apt packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The Debian packages start services (bird, etcd, nginx) we do not want running in the
  # root namespace: while installing, a policy-rc.d (if the machine has none) forbids it.
  own_policy=
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    own_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$own_policy"
    chmod 755 "$own_policy"
    trap 'rm -f "$own_policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  [[ -z $own_policy ]] || { rm -f "$own_policy"; trap - EXIT; }
  for svc in bird etcd nginx; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
  for svc in bird etcd; do
    pkill -x "$svc" >/dev/null 2>&1 || true
  done
fi

# BCC compiles against /lib/modules/$(uname -r)/{build,source}. This kernel ships none, so link
# Debian's newest headers (the networking UAPI that our programs use is stable).
kver=$(uname -r)
moddir=/lib/modules/$kver
if [[ ! -e $moddir/build ]]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  common=${hdr%-amd64}-common
  [[ -n $hdr && -d $common ]] || { echo "[setup] no linux-headers under /usr/src" >&2; exit 1; }
  log "linking kernel headers for BCC: $hdr"
  mkdir -p "$moddir"
  ln -sfn "$hdr" "$moddir/build"
  ln -sfn "$common" "$moddir/source"
fi

if ! mountpoint -q /sys/fs/bpf; then
  log "mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi

if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv (Debian python3 with system site-packages, for BCC)"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [[ ! -e $stamp ]]; then
  log "installing pyfelix and its test extras into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
log "ready"
