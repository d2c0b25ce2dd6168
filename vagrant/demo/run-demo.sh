#!/usr/bin/env bash
# The policy demo of the Vagrant lab. Run on the machine that ran `vagrant up`, from anywhere:
#   vagrant/demo/run-demo.sh            # demo, then clean up
#   KEEP=1 vagrant/demo/run-demo.sh     # leave pods and policy in place to poke at
# Steps: cluster state into etcd (through node1) -> pods on every node -> wait for the agents
# -> connectivity matrix -> apply policy.yaml -> matrix again -> clean up.
# Each node probes from its own pods, so every line is traffic that crossed a real node.
set -euo pipefail
cd "$(dirname "$0")/.."  # vagrant/, where the Vagrantfile is

DATASTORE=${PYFELIX_DATASTORE:-etcd3://198.18.0.10:2379}
read -r -a NODES <<<"${PYFELIX_DEMO_NODES:-node1 node2}"
DEMO=/opt/pyfelix/vagrant/demo
PY=/opt/pyfelix/.venv/bin/python
PYFELIX=/opt/pyfelix/.venv/bin/pyfelix
SETTLE_SECONDS=${SETTLE_SECONDS:-10}  # policy and BGP propagation after a change

on() {  # NODE COMMAND...: run COMMAND as root on a node VM
  local node=$1
  shift
  vagrant ssh "$node" --no-tty -c "sudo $*"
}

matrix() {
  local node
  echo "=== $1"
  for node in "${NODES[@]}"; do
    on "$node" "$PY $DEMO/vmlab.py probe --node $node"
  done
}

cleanup() {
  local node
  echo "=== cleaning up"
  for node in "${NODES[@]}"; do
    on "$node" "$PY $DEMO/vmlab.py down --node $node" || true
  done
  on "${NODES[0]}" "$PYFELIX delete -f $DEMO/policy.yaml --skip-not-exists --datastore $DATASTORE" || true
  on "${NODES[0]}" "$PYFELIX delete -f $DEMO/cluster.yaml --skip-not-exists --datastore $DATASTORE" || true
}
[[ ${KEEP:-0} == 1 ]] || trap cleanup EXIT

echo "=== cluster state -> $DATASTORE"
on "${NODES[0]}" "$PYFELIX apply -f $DEMO/cluster.yaml --datastore $DATASTORE"
for node in "${NODES[@]}"; do
  echo "=== pods on $node"
  on "$node" "$PY $DEMO/vmlab.py up --node $node"
  on "$node" "$PY $DEMO/vmlab.py wait-ready"
done
sleep "$SETTLE_SECONDS"
matrix "before policy: every pod reaches every pod"

echo "=== policy -> $DATASTORE"
on "${NODES[0]}" "$PYFELIX apply -f $DEMO/policy.yaml --datastore $DATASTORE"
sleep "$SETTLE_SECONDS"
matrix "after policy: other/intruder is denied to db/postgres and web/cache"

echo "=== BGP sessions on ${NODES[0]}"
on "${NODES[0]}" "birdc -s /run/bird/bird.ctl show protocols"
