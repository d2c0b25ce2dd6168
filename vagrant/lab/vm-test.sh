#!/usr/bin/env bash
# `make vm-test` (run as root): vm-test.sh BOX_DIR LAB_DIR HOST_PYTHON
#   1. the kernel matrix: the real BPF tests on the host's kernel and on the box's 6.1 kernel
#      (a one-shot VM with no network device; vagrant/box/kernel_matrix.py);
#   2. the lab: inside a network + mount namespace of its own (netns-libvirt.sh), a private
#      libvirtd, `vagrant up` (etcd + node1 + node2), the cross-node policy scenario
#      (lab-steps.sh), and `vagrant destroy -f`, also on failure or interrupt.
# Prints each part's result and time; exits non-zero when any part failed.
set -uo pipefail
box=${1:?usage: vm-test.sh BOX_DIR LAB_DIR HOST_PYTHON}
lab=${2:?}
# absolute: the lab's steps run from another directory (make passes .venv/bin/python)
# (not realpath: a venv's python is a symlink, and resolving it leaves the venv)
python=$(cd "$(dirname "${3:?}")" && pwd)/$(basename "$3")
[ -x "$python" ] || { echo "vm-test: no host Python at $3" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
for f in pyfelix.box vmlinuz initrd.img rootfs.raw accel; do
  [[ -e $box/$f ]] || { echo "vm-test: $box/$f missing: run \`make vm-box\` first" >&2; exit 2; }
done
accel=$(cat "$box/accel")
mkdir -p "$lab"
summary=()
failed=0
t_all=$(date +%s)

if [[ ${PYFELIX_VM_SKIP_MATRIX:-0} == 1 ]]; then
  summary+=("kernel matrix: skipped (PYFELIX_VM_SKIP_MATRIX=1)")
else
  echo "=== [vm-test] kernel matrix ($accel)"
  t0=$(date +%s)
  "$python" "$here/../box/kernel_matrix.py" --box "$box" --accel "$accel" --keep "$lab/kernel-matrix"
  rc=$?
  summary+=("kernel matrix: $([[ $rc == 0 ]] && echo PASS || echo FAIL) in $(($(date +%s) - t0)) s")
  ((rc == 0)) || failed=1
fi

if [[ ${PYFELIX_VM_SKIP_LAB:-0} == 1 ]]; then
  summary+=("lab: skipped (PYFELIX_VM_SKIP_LAB=1)")
else
  echo "=== [vm-test] lab: etcd + node1 + node2 (libvirt $accel, in a network namespace)"
  t0=$(date +%s)
  PYFELIX_VM_DRIVER=$accel PYFELIX_BOX_DIR=$box PYFELIX_LAB_DIR=$lab \
    "$here/netns-libvirt.sh" "$lab" "$here/lab-steps.sh" "$lab" "$python"
  rc=$?
  rm -rf "$here/../.vagrant"  # Vagrant's machine ids of the lab just deleted
  summary+=("lab: $([[ $rc == 0 ]] && echo PASS || echo "FAIL (exit $rc)") in $(($(date +%s) - t0)) s")
  ((rc == 0)) || failed=1
fi

echo "=== [vm-test] summary ($(($(date +%s) - t_all)) s in all)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
