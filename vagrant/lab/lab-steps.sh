#!/usr/bin/env bash
# The lab run of `make vm-test`, inside the lab's network namespace with its private libvirtd
# (started by netns-libvirt.sh only): lab-steps.sh LAB_DIR HOST_PYTHON
#   vagrant up (etcd, node1, node2: the agent, confd and BIRD as systemd units on the nodes)
#   -> cluster state into etcd -> the demo's pods on both nodes -> agents ready
#   -> probes from every pod to every other pod's ports, across the VMs (all allowed)
#   -> BGP: each node learned the other node's pod routes from BIRD
#   -> demo/policy.yaml -> probes again (intruder denied to postgres and cache, rest allowed)
#   -> vagrant destroy -f (always, also on failure or interrupt).
# Each step prints its time; the probe results are checked by check_probes.py.
set -euo pipefail
lab=${1:?usage: lab-steps.sh LAB_DIR HOST_PYTHON}
python=${2:?}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."  # vagrant/, where the Vagrantfile is
export VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_CHECKPOINT_DISABLE=1
DATASTORE=etcd3://198.18.0.10:2379
DEMO=/opt/pyfelix/vagrant/demo
PY=/opt/pyfelix/.venv/bin/python
PYFELIX=/opt/pyfelix/.venv/bin/pyfelix
NODES=(node1 node2)
SETTLE_SECONDS=${SETTLE_SECONDS:-20}
t_start=$(date +%s)
step() { printf '=== [lab %4d s] %s\n' "$(($(date +%s) - t_start))" "$*"; }
on() {  # NODE COMMAND...: a command as root on a VM
  local node=$1
  shift
  vagrant ssh "$node" --no-tty -c "sudo $*"
}

destroy() {
  local rc=$?
  trap - EXIT INT TERM
  step "destroying the lab (exit $rc so far)"
  for vm in etcd "${NODES[@]}"; do
    on "$vm" "journalctl -b --no-pager -n 200 -u 'pyfelix-*'" >"$lab/journal-$vm.log" 2>&1 || true
  done
  vagrant destroy -f || rc=1
  step "lab destroyed"
  exit "$rc"
}
trap destroy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "vagrant up (etcd, ${NODES[*]}; driver ${PYFELIX_VM_DRIVER:-from .box/accel})"
vagrant up --provider libvirt
step "up"
vagrant status

step "cluster state -> $DATASTORE"
on node1 "$PYFELIX apply -f $DEMO/cluster.yaml --datastore $DATASTORE"
for node in "${NODES[@]}"; do
  step "pods on $node"
  on "$node" "$PY $DEMO/vmlab.py up --node $node"
  on "$node" "$PY $DEMO/vmlab.py wait-ready --timeout 900"
done
sleep "$SETTLE_SECONDS"

probe_all() {  # PHASE
  local node
  for node in "${NODES[@]}"; do
    on "$node" "$PY $DEMO/vmlab.py probe --node $node -o json" >"$lab/probes-$1-$node.json"
  done
  "$python" "$here/check_probes.py" "$1" "$lab"/probes-"$1"-*.json
}
step "probes before policy"
probe_all before

step "BGP: routes to the other node's pods, learned by BIRD"
for node in "${NODES[@]}"; do
  on "$node" "birdc -s /run/bird/bird.ctl show protocols"
  on "$node" "ip route show proto bird" | tee "$lab/routes-$node.txt"
done
grep -q '^10\.65\.2\.' "$lab/routes-node1.txt" || { echo "node1 has no BGP route to node2's pods" >&2; exit 1; }
grep -q '^10\.65\.1\.' "$lab/routes-node2.txt" || { echo "node2 has no BGP route to node1's pods" >&2; exit 1; }

step "policy -> $DATASTORE"
on node1 "$PYFELIX apply -f $DEMO/policy.yaml --datastore $DATASTORE"
sleep "$SETTLE_SECONDS"
step "probes after policy"
probe_all after
step "lab scenario passed"
