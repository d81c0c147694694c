#!/usr/bin/env bash
# The README's first command. On a fresh Debian/Ubuntu machine, as root, from a clone:
#   1. system packages and .venv (scripts/setup.sh)
#   2. the local testbed, slot 0: machines pve and ct (systemd-nspawn, each in its own network
#      namespace, reached over SSH); writes inventory/testbed/hosts.yml
#   3. llama.cpp's llama-server (built once per machine, then cached; a progress line every 30 s)
#      and a tiny generated model's persistent copy, put on ct as a user puts an engine there
#   4. playbooks/site.yml against the testbed, over SSH, as in production, with the spec the
#      testbed really has (inventory/testbed/serving.yml: no GPU, the tiny model, one server)
#   5. `ct200-doctor check` inside ct: every check that applies to the testbed passes (the GPU
#      ones do not apply: the spec declares none), else this script fails
#   6. a completion from the server under its systemd unit, and the reboot that shows the
#      zero-touch recovery
# Running it again reuses the testbed (and recovers one left by a killed run).
# Take it down with: .venv/bin/python -m testbed down (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "quickstart: the testbed needs root (network namespaces, mounts, systemd-nspawn): run" \
       "\`sudo bash scripts/quickstart.sh\`" >&2
  exit 1
fi

SPEC=inventory/testbed/serving.yml
INVENTORY=inventory/testbed/hosts.yml
PORT=8081
step() { printf '\n== %s\n' "$*"; }
fail() { echo "quickstart: $*" >&2; exit 1; }

step "setup: system packages and .venv"
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
PY=.venv/bin/python

step "testbed: up (the first run builds the rootfs cache: about 2 minutes)"
"$PY" -m testbed up

step "llama-server and the tiny model on ct (the first run builds llama-server: see README)"
"$PY" -m testbed llama

step "ansible-playbook -i $INVENTORY -e @$SPEC playbooks/site.yml"
ansible-playbook -i "$INVENTORY" -e "@$SPEC" playbooks/site.yml

step "ct200-doctor check, in the ct machine"
set +e
"$PY" -m testbed ssh ct -- ct200-doctor check
rc=$?
set -e
case $rc in
  0) echo "quickstart: doctor: every check that applies to the testbed passed" ;;
  255) fail "cannot reach the ct machine over SSH; see \`$PY -m testbed status\`" ;;
  *) fail "doctor: exit $rc (1 warnings, 2 failures, 3 the doctor broke): each failure above" \
          "names its fix; this run stops here" ;;
esac

step "a completion from llama-server, under ct200-server-tiny.service on ct"
"$PY" -m testbed ssh ct -- systemctl is-active ct200-server-tiny.service
# The script reaches the machine's python3 on standard input (ssh passes it through).
"$PY" -m testbed ssh ct -- python3 - "$PORT" <<'PY'
import json, sys, urllib.request

body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8}
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(req, timeout=60) as resp:
    answer = json.load(resp)
# A tiny random-weight model (testbed/tiny_gguf.py): its text is gibberish by design.
print(f"prompt:     {body['prompt']!r}")
print(f"completion: {answer['choices'][0]['text']!r}")
print(f"usage:      {answer['usage']}")
PY

step "done"
cat <<EOT
The testbed stays up and serves. In a new shell, from $PWD:
  . .venv/bin/activate                                    # ct200-doctor, ansible-playbook on PATH
  python -m testbed status
  python -m testbed ssh ct                                # log in
  python -m testbed ssh ct -- ct200-serve status          # what ct serves, and each unit

Zero-touch recovery: power-cycle both machines (pve boots first; its pve-guests stand-in
starts the container; /dev/shm starts empty), then ask the container's boot chain:
  python -m testbed reboot
  python -m testbed ssh ct -- ct200-serve chain           # this boot's steps, timed: serving?
  python -m testbed ssh ct -- ct200-serve smoke           # a real completion again
  python -m testbed ssh ct -- ct200-doctor check          # and the doctor, clean again

  ansible-playbook -i $INVENTORY -e @$SPEC playbooks/site.yml   # converge again
  make test                                               # lint + all tests (their own slots)
  python -m testbed down                                  # remove it
EOT
