#!/usr/bin/env bash
# Download pciutils (lspci, setpci) and the libraries it needs as .deb files into
# .gpu-carry/debs/ (gitignored), for tests/gpu/test_pci_lspci.py on the GPU machine, which has
# no network: pass `carry: [".gpu-carry"]` to the device tool. The test unpacks them with
# `dpkg -x` into a temp dir and runs that lspci with LD_LIBRARY_PATH; nothing is installed.
# Beyond pciutils, libpci3 and libkmod2: what `apt-cache depends` lists that a minimal
# Ubuntu/Debian may lack (libssl3 before Ubuntu 22.04) or that lspci should find (pci.ids).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-carry/debs
rm -rf "$out" && mkdir -p "$out"
packages=(pciutils libpci3 libkmod2 pci.ids libssl3 libzstd1 liblzma5 zlib1g libudev1)
(cd "$out" && apt-get download "${packages[@]}")
# Plain names (the downloaded ones carry %3a, + and ~), and what they are, for the record.
for deb in "$out"/*.deb; do
  pkg=$(dpkg-deb --field "$deb" Package)
  echo "$pkg $(dpkg-deb --field "$deb" Version) $(sha256sum "$deb" | cut -d' ' -f1)" >>"$out/MANIFEST"
  mv "$deb" "$out/$pkg.deb"
done
cat "$out/MANIFEST"
