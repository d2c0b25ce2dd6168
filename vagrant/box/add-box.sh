#!/usr/bin/env bash
# add-box.sh BOX_DIR: `vagrant box add` the box built by build-box.sh (as pyfelix/bookworm-local,
# into $VAGRANT_HOME), unless that exact build (box.stamp) is already added.
set -euo pipefail
box=${1:?usage: add-box.sh BOX_DIR}
name=${PYFELIX_BOX:-pyfelix/bookworm-local}
stamp=$(cat "$box/box.stamp")
added=$box/box.added
if [[ $(cat "$added" 2>/dev/null) == "$stamp" ]] && vagrant box list | grep -q "^$name "; then
  echo "[vm-box] $name already added (build $stamp)"
  exit 0
fi
vagrant box add --force --name "$name" --provider libvirt "$box/pyfelix.box"
printf '%s\n' "$stamp" >"$added"
echo "[vm-box] added $name (build $stamp)"
