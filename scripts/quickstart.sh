#!/usr/bin/env bash
# The README's first command. On a fresh Debian/Ubuntu machine, as root, from a clone:
#   1. system packages and .venv (scripts/setup.sh)
#   2. the local testbed, slot 0: machines pve and ct (systemd-nspawn, each in its own network
#      namespace, reached over SSH); writes inventory/testbed/hosts.yml
#   3. playbooks/site.yml against it, over SSH, as in production
#   4. `ct200-doctor check` inside the ct machine. The testbed has no GPU, so the doctor reports
#      failures (exit 2): that is expected here and does not fail this script.
# Running it again reuses the testbed (and recovers one left by a killed run).
# Take it down with: .venv/bin/python -m testbed down (from the repository root)
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
"$PY" -m testbed up

step "ansible-playbook -i inventory/testbed/hosts.yml playbooks/site.yml"
ansible-playbook -i inventory/testbed/hosts.yml playbooks/site.yml

step "ct200-doctor check, in the ct machine"
set +e
"$PY" -m testbed ssh ct -- ct200-doctor check
rc=$?
set -e
case $rc in
  0) echo "quickstart: doctor: all checks passed" ;;
  1) echo "quickstart: doctor: warnings" ;;
  2) echo "quickstart: doctor: failures, as expected on the testbed (it has no NVIDIA GPU)" ;;
  3) echo "quickstart: doctor: the doctor itself broke (exit 3); see above" ;;
  127) echo "quickstart: doctor: ct200-doctor is not installed in the ct machine (exit 127)" ;;
  255) echo "quickstart: cannot reach the ct machine over SSH; see \`$PY -m testbed status\`" >&2
       exit 1 ;;
  *) echo "quickstart: doctor: exit $rc" ;;
esac

step "done"
cat <<EOT
The testbed stays up. In a new shell, from $PWD:
  . .venv/bin/activate                                    # ct200-doctor, ansible-playbook on PATH
  python -m testbed status
  python -m testbed ssh ct                                # log in
  ansible-playbook -i inventory/testbed/hosts.yml playbooks/site.yml   # converge again
  make test                                               # lint + all tests (their own slots)
  python -m testbed down                                  # remove it
EOT
