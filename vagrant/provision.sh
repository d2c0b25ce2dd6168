#!/usr/bin/env bash
# Vagrant provisioner (run as root in each VM): provision.sh ROLE NAME IP DATASTORE_URL
#   ROLE etcd: the project set-up, then etcd as pyfelix-etcd.service on IP:2379.
#   ROLE node: the project set-up, settings in /etc/pyfelix, this node's Node resource (its
#              BGP address) in the datastore, then the agent, confd and BIRD as systemd units.
# Idempotent: `vagrant provision` runs it again without harm.
set -euo pipefail

role=$1 name=$2 ip=$3 datastore=$4
project=/opt/pyfelix
units=$project/vagrant/systemd
venv=$project/.venv
underlay_prefix_len=15  # 198.18.0.0/15, see Vagrantfile
etcd_wait_seconds=300

log() { printf '[provision %s] %s\n' "$name" "$*"; }

# The box built by `make vm-box` has the project's dependencies in /opt/pyfelix-venv (from
# wheels, offline): the project's venv is that one, so setup.sh only adds pyfelix itself.
# (A link in place, e.g. the host's own .venv link copied by an older rsync, is replaced.)
if [[ -d /opt/pyfelix-venv && (! -e $venv || -L $venv) ]]; then
  ln -sfn /opt/pyfelix-venv "$venv"
fi
log "project set-up: scripts/setup.sh"
bash "$project/scripts/setup.sh"
install -d -m 0755 /etc/pyfelix

install_units() {
  local unit
  for unit in "$@"; do
    install -m 0644 "$units/$unit" /etc/systemd/system/
  done
  systemctl daemon-reload
}

wait_for_tcp() {  # host port seconds
  log "waiting up to $3 s for $1:$2"
  timeout "$3" bash -c "until (exec 3<>/dev/tcp/$1/$2) 2>/dev/null; do sleep 2; done"
}

case $role in
etcd)
  printf 'ETCD_IP=%s\n' "$ip" >/etc/pyfelix/etcd.env
  install_units pyfelix-etcd.service
  systemctl enable --now pyfelix-etcd.service
  wait_for_tcp "$ip" 2379 60
  log "etcd serving on $ip:2379"
  ;;
node)
  sed -e "s|@NODENAME@|$name|" -e "s|@DATASTORE@|$datastore|" \
    "$project/vagrant/pyfelix.env.in" >/etc/pyfelix/pyfelix.env
  install -d -m 0700 /etc/pyfelix/bird
  printf 'net.ipv4.ip_forward = 1\n' >/etc/sysctl.d/60-pyfelix.conf
  sysctl -q -p /etc/sysctl.d/60-pyfelix.conf

  endpoint=${datastore#etcd3://}
  endpoint=${endpoint%%,*}
  wait_for_tcp "${endpoint%%:*}" "${endpoint##*:}" "$etcd_wait_seconds"
  log "registering Node $name with BGP address $ip/$underlay_prefix_len"
  "$venv/bin/python" "$project/vagrant/demo/vmlab.py" node-resource \
    --name "$name" --ipv4-address "$ip/$underlay_prefix_len" |
    "$venv/bin/pyfelix" apply -f - --datastore "$datastore"

  install_units pyfelix-agent.service pyfelix-confd.service pyfelix-bird.service \
    pyfelix-bird.path
  systemctl enable --now pyfelix-agent.service pyfelix-confd.service pyfelix-bird.path
  systemctl enable pyfelix-bird.service
  log "agent, confd and BIRD units enabled (BIRD starts once confd wrote its first config)"
  ;;
*)
  echo "provision.sh: unknown role '$role' (etcd or node)" >&2
  exit 2
  ;;
esac
