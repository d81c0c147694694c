#!/usr/bin/env bash
# The README's first command. On a fresh Debian/Ubuntu machine, as root, from a clone:
#   1. system packages and .venv (scripts/setup.sh)
#   2. the local testbed, slot 0: machines pve and ct (systemd-nspawn, each in its own network
#      namespace, reached over SSH); writes inventory/testbed/hosts.yml
#   3. playbooks/site.yml against it, over SSH, as in production
#   4. `ct200-doctor check` inside the ct machine. The testbed has no GPU, so the doctor reports
#      failures (exit 2): that is expected here and does not fail this script.
# Running it again reuses the testbed (and recovers one left by a killed run).
# Take it down with: .venv/bin/python -m ct200_tools.testbed down
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "quickstart: the testbed needs root (network namespaces, mounts, systemd-nspawn): run" \
       "\`sudo bash scripts/quickstart.sh\`" >&2
  exit 1
fi

step() { printf '\n== %s\n' "$*"; }

step "setup: system packages and .venv"
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
PY=.venv/bin/python

step "testbed: up (the first run builds the rootfs cache: about a minute)"
"$PY" -m ct200_tools.testbed up

step "ansible-playbook playbooks/site.yml"
ansible-playbook -i inventory/testbed/hosts.yml playbooks/site.yml

step "ct200-doctor check, in the ct machine"
set +e
"$PY" -m ct200_tools.testbed ssh ct -- ct200-doctor check
rc=$?
set -e
case $rc in
  0) echo "quickstart: doctor: all checks passed" ;;
  1) echo "quickstart: doctor: warnings" ;;
  2) echo "quickstart: doctor: failures, as expected on the testbed (it has no NVIDIA GPU)" ;;
  3) echo "quickstart: doctor: the doctor itself broke (exit 3); see above" ;;
  127) echo "quickstart: doctor: ct200-doctor is not installed in the ct machine (exit 127)" ;;
  255) echo "quickstart: cannot reach the ct machine over SSH; see \`$PY -m ct200_tools.testbed status\`" >&2
       exit 1 ;;
  *) echo "quickstart: doctor: exit $rc" ;;
esac

step "done"
cat <<EOT
The testbed stays up:
  $PY -m ct200_tools.testbed status
  $PY -m ct200_tools.testbed ssh ct                 # log in
  ansible-playbook playbooks/site.yml               # converge again (ansible.cfg uses the testbed)
  make test                                         # lint + all tests (the tests use their own slots)
  $PY -m ct200_tools.testbed down                   # remove it
EOT
