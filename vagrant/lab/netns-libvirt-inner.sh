#!/usr/bin/env bash
# Inside the lab's network and mount namespaces (started by netns-libvirt.sh only):
#   netns-libvirt-inner.sh LIBVIRT_STATE COMMAND...
# Binds the lab's own libvirt directories over the system's, configures libvirt for this
# machine (QEMU as root, no cgroups, no security driver, no `default` network), starts
# virtlogd and libvirtd, checks they run in this namespace, then runs COMMAND.
set -euo pipefail
lv=$1
shift
log() { printf '[lab-libvirt] %s\n' "$*" >&2; }

lab_ns=$(ip netns identify $$)
[[ $lab_ns == pfvm-* ]] || { log "not in a lab network namespace: refusing"; exit 1; }
ip link set lo up

mkdir -p "$lv"/{etc,lib,log,cache,run}
if [[ ! -e $lv/etc/libvirtd.conf ]]; then
  cp -a /etc/libvirt/. "$lv/etc/"
  rm -f "$lv/etc/qemu/networks/default.xml" "$lv/etc/qemu/networks/autostart/"*.xml
  cat >>"$lv/etc/qemu.conf" <<'CONF'
# pyfelix VM lab (netns-libvirt-inner.sh): QEMU as root reads the box's kernel and disks
# under the project directory; this machine has no cgroup delegation or LSM for libvirt.
user = "root"
group = "root"
dynamic_ownership = 0
security_driver = "none"
cgroup_controllers = [ ]
CONF
fi
mount --bind "$lv/etc" /etc/libvirt
mkdir -p /var/lib/libvirt /var/log/libvirt /var/cache/libvirt /run/libvirt
mount --bind "$lv/lib" /var/lib/libvirt
mount --bind "$lv/log" /var/log/libvirt
mount --bind "$lv/cache" /var/cache/libvirt
mount --bind "$lv/run" /run/libvirt
mkdir -p /var/lib/libvirt/images /var/lib/libvirt/dnsmasq /var/lib/libvirt/qemu

virtlogd -d
libvirtd -d
for _ in $(seq 1 60); do
  virsh -c qemu:///system version >/dev/null 2>&1 && break
  sleep 0.5
done
virsh -c qemu:///system version >/dev/null || { log "libvirtd did not start"; exit 1; }
virsh -c qemu:///system net-info default >/dev/null 2>&1 &&
  { log "libvirt's default network exists in the lab: refusing"; exit 1; }
log "libvirtd ready in $lab_ns"
export LIBVIRT_DEFAULT_URI=qemu:///system
"$@"
