# Runs inside a one-shot VM (started by /usr/local/sbin/pyfelix-oneshot in the box, as PID 1's
# child): unpacks the project from the tar archive on /dev/vdb, mounts the writable share
# `results`, and runs the pytest arguments the host wrote to results/pytest-args (one a line)
# with the box's venv, writing results/guest.xml (JUnit) and results/guest.log.
set -u
ip link set lo up
mkdir -p /mnt/results
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /mnt/results || {
  echo "guest-oneshot: no results share" >&2
  exit 2
}
{
  echo "guest kernel $(uname -r), $(nproc) CPU(s), $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  t0=$(date +%s)
  mkdir -p /root/pyfelix
  echo "block devices: $(ls /sys/block | tr '\n' ' ')"
  # the second virtio disk; its node is made from sysfs if devtmpfs has none
  [[ -b /dev/vdb ]] || mknod /dev/vdb b "$(cut -d: -f1 /sys/block/vdb/dev)" "$(cut -d: -f2 /sys/block/vdb/dev)"
  tar -C /root/pyfelix -xf /dev/vdb
  echo "project unpacked in $(($(date +%s) - t0)) s"
  cd /root/pyfelix
  mapfile -t args </mnt/results/pytest-args
  # lab tests: agents compiling BPF with BCC on an emulated CPU (TCG) take minutes to sync
  export PYFELIX_LAB_SYNC_TIMEOUT=600
  t0=$(date +%s)
  PYTHONPATH=/root/pyfelix PYTHONDONTWRITEBYTECODE=1 /opt/pyfelix-venv/bin/python -m pytest \
    -p no:cacheprovider --junitxml=/mnt/results/guest.xml "${args[@]}"
  rc=$?
  echo "guest pytest exit $rc in $(($(date +%s) - t0)) s"
  echo "$rc" >/mnt/results/guest.rc
} 2>&1 | tee /mnt/results/guest.log
sync
