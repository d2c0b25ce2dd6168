#!/usr/bin/env bash
# Builds the VM lab's box from Debian's packages (run as root, from `make vm-box`):
#   build-box.sh OUT_DIR
# Outputs in OUT_DIR:
#   rootfs.raw           Debian 12 root filesystem (ext4 on the whole disk, no partition table)
#   vmlinuz, initrd.img  the box's own kernel (Debian 12, 6.1) and initramfs, for direct boot
#   id_ed25519[.pub]     the key pair the box trusts for user `vagrant` (made here, never shipped)
#   pyfelix.box          the libvirt Vagrant box: box.img (qcow2) + metadata.json + Vagrantfile
#   box.stamp            what was built from (package list, wheels), to skip an identical rebuild
#
# The image has everything a node or the etcd VM needs preinstalled, so nothing is downloaded
# in the VMs: every Debian package scripts/setup.sh asks for (BCC, kernel headers, BIRD 2, etcd,
# iptables, ipset, ...), systemd, OpenSSH and rsync for Vagrant, and a wheelhouse of the
# project's Python dependencies (built on the host with pip) with a pip.conf that installs only
# from it. Disk: no boot loader; the lab boots the kernel directly (QEMU -kernel, libvirt
# <kernel>), root=/dev/vda.
set -euo pipefail

out=${1:?usage: build-box.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
log() { printf '[vm-box] %s\n' "$*"; }

SUITE=bookworm
MIRROR=${PYFELIX_VM_MIRROR:-http://deb.debian.org/debian}
IMAGE_SIZE=${PYFELIX_VM_IMAGE_SIZE:-6G}
# scripts/setup.sh's packages (it then finds nothing missing and never calls apt in a VM) ...
# (comments first: they may hold parentheses)
SETUP_PACKAGES=$(sed -e 's/#.*//' "$repo/scripts/setup.sh" | sed -n '/^APT_PACKAGES=(/,/)/p' |
  sed -e 's/APT_PACKAGES=(//' -e 's/)//' | tr -s ' \n' ' ')
# ... the box's own kernel, and what a Vagrant box needs.
BOX_PACKAGES="linux-image-amd64 linux-headers-amd64 initramfs-tools systemd-sysv udev dbus
  ifupdown isc-dhcp-client openssh-server sudo rsync ca-certificates netbase
  python3-pip iputils-ping netcat-openbsd less"
packages=$(echo "$SETUP_PACKAGES $BOX_PACKAGES" | tr -s ' \n' '\n' | sed '/^$/d' | sort -u | paste -sd,)

stamp_now=$(printf '%s\n' "$packages" "$(sha1sum "$repo/pyproject.toml" "$0")" | sha1sum | cut -c1-16)
if [[ -s $out/pyfelix.box && -s $out/vmlinuz && $(cat "$out/box.stamp" 2>/dev/null) == "$stamp_now" ]]; then
  log "box up to date ($out/pyfelix.box, stamp $stamp_now)"
  exit 0
fi

work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "wheelhouse: the project's Python dependencies (pip, on the host)"
wheels=$work/wheels
python3 -m pip wheel -q --wheel-dir "$wheels" "$repo[test]" pip setuptools wheel >/dev/null
rm -f "$wheels"/pyfelix-*.whl
log "  $(ls "$wheels" | wc -l) wheels"

if [[ ! -s $out/id_ed25519 ]]; then
  ssh-keygen -q -t ed25519 -N '' -C pyfelix-vmlab -f "$out/id_ed25519"
fi

log "mmdebstrap $SUITE ($(tr ',' '\n' <<<"$packages" | wc -l) packages requested)"
t0=$(date +%s)
rootfs=$work/rootfs
mmdebstrap --mode=root --variant=apt --format=directory \
  --include="$packages" \
  --aptopt='APT::Install-Recommends "false"' \
  --essential-hook='mkdir -p "$1/usr/sbin" && printf "#!/bin/sh\nexit 101\n" >"$1/usr/sbin/policy-rc.d" && chmod 755 "$1/usr/sbin/policy-rc.d"' \
  --customize-hook='rm -f "$1/usr/sbin/policy-rc.d"' \
  --customize-hook="mkdir -p \"\$1/opt/wheels\" && cp $wheels/*.whl \"\$1/opt/wheels/\"" \
  --customize-hook="mkdir -p \"\$1/home/vagrant/.ssh\" && cp $out/id_ed25519.pub \"\$1/home/vagrant/.ssh/authorized_keys\"" \
  --customize-hook="chroot \"\$1\" /bin/bash -s < $here/customize-guest.sh" \
  "$SUITE" "$rootfs" "$MIRROR"
log "  mmdebstrap: $(($(date +%s) - t0)) s"

cp -L "$rootfs"/boot/vmlinuz-* "$work/vmlinuz"
cp -L "$rootfs"/boot/initrd.img-* "$work/initrd.img"
kernel_release=$(ls "$rootfs/lib/modules")
log "kernel $kernel_release"

log "ext4 image ($IMAGE_SIZE, from the directory: no loop device, no mount)"
rm -f "$work/rootfs.raw"
mkfs.ext4 -q -L pyfelix-root -d "$rootfs" "$work/rootfs.raw" "$IMAGE_SIZE"

log "Vagrant box (libvirt provider): box.img + metadata.json + Vagrantfile"
boxdir=$work/box
mkdir -p "$boxdir"
qemu-img convert -O qcow2 "$work/rootfs.raw" "$boxdir/box.img"
virtual_gb=$(( $(qemu-img info --output=json "$boxdir/box.img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])') / 1024**3 ))
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$virtual_gb" >"$boxdir/metadata.json"
cat >"$boxdir/Vagrantfile" <<'VF'
# Box defaults (pyfelix VM lab): the box has no boot loader; the project's Vagrantfile sets
# libvirt's kernel/initrd/cmd_line to the files made beside the box by vagrant/box/build-box.sh.
Vagrant.configure("2") do |config|
  config.ssh.username = "vagrant"
end
VF
tar -C "$boxdir" -cf "$work/pyfelix.box" metadata.json Vagrantfile box.img

mv -f "$work/rootfs.raw" "$work/vmlinuz" "$work/initrd.img" "$work/pyfelix.box" "$out/"
printf '%s\n' "$kernel_release" >"$out/kernel-release"
printf '%s\n' "$stamp_now" >"$out/box.stamp"
log "done: $out/pyfelix.box ($(du -h "$out/pyfelix.box" | cut -f1)), kernel $kernel_release"
