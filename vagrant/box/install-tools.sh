#!/usr/bin/env bash
# Host tools for the VM lab (run as root, from `make vm-box` / `make vm-test`): QEMU, mmdebstrap,
# libvirt, Vagrant and vagrant-libvirt, all from Debian's packages. Idempotent.
#
# Invariant: nothing of libvirt runs or is configured to run in the machine's root network
# namespace. Debian's postinst scripts would start libvirtd, virtlogd and the `default` NAT
# network (bridge virbr0, dnsmasq, iptables rules); a policy-rc.d forbids every service start
# while installing, the `default` network's autostart link is removed, and the root
# namespace's links are checked afterwards. The lab starts its own libvirtd inside a network
# and mount namespace of its own (vagrant/lab/netns-libvirt.sh).
set -euo pipefail

PACKAGES=(qemu-system-x86 qemu-utils mmdebstrap vagrant vagrant-libvirt
  libvirt-daemon-system libvirt-clients dnsmasq-base python3-pip)
log() { printf '[vm-tools] %s\n' "$*"; }

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  own_policy=
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    own_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# pyfelix vm-tools: no service starts while installing\nexit 101\n' >"$own_policy"
    chmod 755 "$own_policy"
    trap 'rm -f "$own_policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -z $own_policy ]] || { rm -f "$own_policy"; trap - EXIT; }
fi

# The `default` network must never autostart in the root namespace.
rm -f /etc/libvirt/qemu/networks/autostart/default.xml
for unit in libvirtd.service libvirtd.socket libvirtd-ro.socket libvirtd-admin.socket \
  virtlogd.service virtlogd.socket virtlockd.socket; do
  systemctl disable --now "$unit" >/dev/null 2>&1 || true
done

# Check, not assume: no libvirt bridge and no libvirt daemon in the root namespace.
if ip -o link show | grep -Eq ': (virbr[0-9]+|vnet[0-9]+)[:@]'; then
  log "ERROR: a libvirt link exists in the root network namespace:" >&2
  ip -br link >&2
  exit 1
fi
root_netns=$(readlink /proc/self/ns/net)  # make runs in the root namespace
for pid in $(pgrep -x libvirtd; pgrep -x dnsmasq); do
  if [[ $(readlink "/proc/$pid/ns/net" 2>/dev/null) == "$root_netns" ]]; then
    log "ERROR: $(cat /proc/$pid/comm) (pid $pid) runs in the root network namespace" >&2
    exit 1
  fi
done
log "ready (no libvirt link or daemon in the root network namespace)"
