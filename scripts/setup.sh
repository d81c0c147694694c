#!/usr/bin/env bash
# Install everything ct200-tools and its tests need on a fresh Debian/Ubuntu machine (as root):
# the system packages, then a virtualenv in .venv with the package and its test/lint/ansible extras.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# cmake, g++ and make build the testbed's llama-server once per machine (testbed/llama_build.py).
for pkg in python3-venv:python3 debootstrap:debootstrap systemd-container:systemd-nspawn \
           iproute2:ip openssh-client:ssh pciutils:setpci systemd:systemd-analyze \
           cmake:cmake g++:g++ make:make strace:strace \
           texlive-latex-base:pdflatex poppler-utils:pdftoppm; do
  command -v "${pkg#*:}" >/dev/null 2>&1 || need_apt+=("${pkg%%:*}")
done
# pdflatex compiles ct200-bench report's speedup.tex in tests/unit (booktabs is in the
# recommended set): about 48 MB to download, 150 MB installed with TeX Live's base.
{ command -v kpsewhich >/dev/null && kpsewhich booktabs.sty >/dev/null; } ||
  need_apt+=(texlive-latex-recommended)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages: ${need_apt[*]}; run as root or: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The build backend too (pyproject's build-system.requires): the wheel test and `make wheelhouse`
# build the ct200-tools wheel with it, without network (--no-build-isolation).
mapfile -t build_requires < <(.venv/bin/python -c \
  'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
.venv/bin/python -m pip install -q "${build_requires[@]}"
.venv/bin/python -m pip install -q -e '.[test,lint,ansible,report]'
echo "setup: ok ($(.venv/bin/python --version), venv .venv)"
# The commands (ct200-doctor, ct200-stage, ansible-playbook, ansible-lint) live in the venv; this
# script leaves the system's PATH and /usr/local/bin alone.
echo "setup: to put ct200-doctor and ansible-playbook on your PATH in this shell: . .venv/bin/activate"
