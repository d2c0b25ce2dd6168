#!/usr/bin/env bash
# Can a guest run under KVM here? Checked, not assumed (run as root):
#   kvm-check.sh BOX_DIR      prints `kvm` or `qemu` (TCG) on stdout, the evidence on stderr
# Boots the box's kernel (BOX_DIR/vmlinuz, initrd.img, rootfs.raw as a throw-away snapshot)
# with init=/bin/true under KVM: a working KVM guest reaches "Run /bin/true as init process"
# and panics on init's exit (QEMU then quits: -no-reboot). A hanging nested-KVM guest never
# gets there within the time limit. No network device is given to the guest. (The plain
# `-cpu host` model aborts QEMU here on MSR 0x10a, IA32_ARCH_CAPABILITIES: it is masked.)
set -uo pipefail
box=${1:?usage: kvm-check.sh BOX_DIR}
limit=${PYFELIX_KVM_CHECK_SECONDS:-60}
log() { printf '[kvm-check] %s\n' "$*" >&2; }

if [[ ! -w /dev/kvm ]]; then
  log "/dev/kvm missing or not writable: TCG"
  echo qemu
  exit 0
fi
serial=$(mktemp)
trap 'rm -f "$serial"' EXIT
t0=$(date +%s%N)
timeout --kill-after=5 "$limit" qemu-system-x86_64 -enable-kvm -cpu host,-arch-capabilities -m 512 -smp 1 \
  -nodefaults -display none -no-reboot -nic none \
  -kernel "$box/vmlinuz" -initrd "$box/initrd.img" \
  -drive "file=$box/rootfs.raw,format=raw,if=virtio,snapshot=on" \
  -serial "file:$serial" \
  -append "console=ttyS0 root=/dev/vda ro init=/bin/true panic=-1" >/dev/null 2>&1
rc=$?
elapsed=$(( ($(date +%s%N) - t0) / 100000000 ))  # tenths of a second
elapsed=$((elapsed / 10)).$((elapsed % 10))
if grep -q 'Run /bin/true as init process\|Attempted to kill init' "$serial"; then
  log "KVM guest reached init in ${elapsed} s: kvm"
  echo kvm
else
  log "KVM guest did not reach init within ${limit} s (qemu exit $rc, ${elapsed} s; last console line: $(tail -c 200 "$serial" | tr -d '\r' | tail -n 1)): TCG"
  echo qemu
fi
