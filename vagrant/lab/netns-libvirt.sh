#!/usr/bin/env bash
# A private libvirt for the VM lab, never in the machine's root network namespace (run as root):
#   netns-libvirt.sh STATE_DIR COMMAND [ARG...]
# Creates a network namespace pfvm-<pid> and, inside it, a mount namespace in which libvirt's
# directories (/etc/libvirt, /var/lib/libvirt, /var/log/libvirt, /var/cache/libvirt,
# /run/libvirt) are the lab's own, under STATE_DIR; starts virtlogd and libvirtd there, runs
# COMMAND (e.g. vagrant) in the same namespaces, and returns its exit status.
#
# Invariants: every bridge, dnsmasq, iptables rule and QEMU process that libvirt or Vagrant
# creates lives in pfvm-<pid>; libvirt's `default` network does not exist in the lab's config;
# on exit, failure or interrupt every process left in the namespace is killed, the namespace
# is deleted (its links go with it) and STATE_DIR's libvirt state is removed.
set -euo pipefail
state=${1:?usage: netns-libvirt.sh STATE_DIR COMMAND...}
shift
(($#)) || { echo "netns-libvirt.sh: no command" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$state"
state=$(cd "$state" && pwd)
ns=pfvm-$$
log() { printf '[netns-libvirt %s] %s\n' "$ns" "$*" >&2; }

teardown() {
  local rc=$? pids
  trap - EXIT INT TERM
  if ip netns list | grep -qx "$ns\( .*\)\?"; then
    pids=$(ip netns pids "$ns" || true)
    if [[ -n $pids ]]; then
      log "stopping what runs in $ns: $(echo $pids)"
      kill $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" || true)
        [[ -z $pids ]] && break
        sleep 1
      done
      [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
    fi
    ip netns del "$ns"
    log "namespace deleted"
  fi
  rm -rf "$state/libvirt"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns"
log "network namespace created; libvirt state in $state/libvirt"
# `ip netns exec` gives the command a mount namespace of its own; unshare makes sure nothing
# mounted inside propagates back to the machine's, and puts the lab in a PID namespace whose
# init is the inner script: when it exits, the kernel kills and reaps whatever is left
# (libvirtd, virtlogd, dnsmasq, QEMU), even after a SIGKILL of this script.
# In the background with `wait`: bash runs the INT/TERM traps (and so the teardown) at once,
# not after the lab's command finished.
ip netns exec "$ns" unshare --mount --propagation private --pid --fork --mount-proc \
  "$here/netns-libvirt-inner.sh" "$state/libvirt" "$@" &
wait $!
