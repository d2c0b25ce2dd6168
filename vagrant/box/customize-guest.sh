# Runs inside the box's root filesystem (chroot, from build-box.sh): users, SSH, network,
# fstab, the Python wheelhouse as pip's only index, and the dependencies' venv.
set -euo pipefail
echo pyfelix-box >/etc/hostname
printf '/dev/vda / ext4 defaults,errors=remount-ro 0 1\nbpffs /sys/fs/bpf bpf defaults 0 0\n' >/etc/fstab
# Vagrant's user: key-only SSH (the key pair is made at build time), password-less sudo.
id vagrant >/dev/null 2>&1 || useradd -m -s /bin/bash vagrant
chown -R vagrant:vagrant /home/vagrant/.ssh
chmod 700 /home/vagrant/.ssh && chmod 600 /home/vagrant/.ssh/authorized_keys
printf 'vagrant ALL=(ALL) NOPASSWD:ALL\nDefaults:vagrant !requiretty\n' >/etc/sudoers.d/vagrant
chmod 440 /etc/sudoers.d/vagrant
passwd -d root >/dev/null
printf 'UseDNS no\nPasswordAuthentication no\n' >/etc/ssh/sshd_config.d/pyfelix.conf
# The first NIC (Vagrant's management network) by DHCP; Vagrant writes the private ones.
printf 'auto lo\niface lo inet loopback\n\nallow-hotplug eth0\niface eth0 inet dhcp\n' \
  >/etc/network/interfaces
# Services the packages enabled that a node must not run by themselves: the units in
# vagrant/systemd start BIRD and etcd with the lab's configuration.
systemctl disable bird.service etcd.service nginx.service iperf3.service >/dev/null 2>&1 || true
systemctl enable ssh.service systemd-networkd-wait-online.service >/dev/null 2>&1 || true
systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \
  fstrim.timer >/dev/null 2>&1 || true
# pip installs only from the wheelhouse: no network is needed (or reachable) in a VM.
printf '[global]\nno-index = true\nfind-links = /opt/wheels\n' >/etc/pip.conf
# The dependencies, preinstalled: the kernel matrix runs the project from a read-only share
# with this venv; scripts/setup.sh in a lab VM builds /opt/pyfelix/.venv from the same wheels.
python3 -m venv --system-site-packages /opt/pyfelix-venv
/opt/pyfelix-venv/bin/pip install -q --upgrade pip setuptools
reqs=$(cd /opt/wheels && ls *.whl | sed -E 's/^([^-]+)-.*/\1/' | grep -vxE 'pip|setuptools|wheel')
# shellcheck disable=SC2086
/opt/pyfelix-venv/bin/pip install -q $reqs
apt-get clean
rm -rf /var/lib/apt/lists/*
# Direct-boot entry for one-shot runs (the kernel matrix): the kernel starts this instead of
# systemd (init=/usr/local/sbin/pyfelix-oneshot); it mounts the basics and the host's read-only
# 9p share `pyfelix`, runs vagrant/box/guest-oneshot.sh from it, and powers the VM off.
cat >/usr/local/sbin/pyfelix-oneshot <<'ONESHOT'
#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -o remount,rw /
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
modprobe 9pnet_virtio
mkdir -p /mnt/pyfelix
mount -t 9p -o trans=virtio,version=9p2000.L,ro pyfelix /mnt/pyfelix
bash /mnt/pyfelix/vagrant/box/guest-oneshot.sh
echo "pyfelix-oneshot: exit $?"
sync
echo o >/proc/sysrq-trigger
sleep 30
ONESHOT
chmod 755 /usr/local/sbin/pyfelix-oneshot
