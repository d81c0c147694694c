#!/usr/bin/env bash
# Pack what tests/gpu/test_gpu_server.py needs on the GPU machine, which has no network, into
# .gpu-carry/ (gitignored; pass `carry: [".gpu-carry"]` to the device tool):
#   llama-src.tar.xz  the llama.cpp tree vendored in the same llama-cpp-python sdist the testbed
#                     builds (testbed/llama_build.py: version and sha256 pinned, pip checks the
#                     hash), without what a CUDA llama-server build never reads (models/*.gguf,
#                     docs, media, benches, the other GPU backends): the sdist is 76 MB, over the
#                     device tool's 64 MiB carry limit; this is about 10 MB
#   wheels/           gguf (the testbed's model generator), xxhash/psutil and aiohttp with what it
#                     imports (ct200-bench), nvidia-ml-py (its telemetry: pynvml) for the GPU
#                     machine's Python, in case its image lacks
#                     them (tests/gpu/carried.py); unzipped onto sys.path, never installed
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-carry
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(python3 -c 'import testbed.llama_build as b; print(b.VERSION)')
sha=$(python3 -c 'import testbed.llama_build as b; print(b.SDIST_SHA256)')
echo "llama-cpp-python==$version --hash=sha256:$sha" >"$work/req.txt"
python3 -m pip download -q --no-deps --no-binary llama-cpp-python --require-hashes \
  -r "$work/req.txt" -d "$work"
root="llama_cpp_python-$version/vendor/llama.cpp"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work" "$root"
src="$work/$root"
rm -rf "$src"/.git "$src"/docs "$src"/media "$src"/benches "$src"/models/*.gguf*
for backend in "$src"/ggml/src/ggml-*/; do
  case "$(basename "$backend")" in ggml-cpu | ggml-cuda | ggml-blas) ;; *) rm -rf "$backend" ;; esac
done
echo "llama-cpp-python $version sha256:$sha" >"$src/CT200_SOURCE"
tar -C "$work/llama_cpp_python-$version/vendor" -cJf "$out/llama-src.tar.xz.partial" llama.cpp
mv "$out/llama-src.tar.xz.partial" "$out/llama-src.tar.xz"
rm -rf "$out/wheels" && mkdir -p "$out/wheels"
python3 -m pip download -q --no-deps gguf aiohappyeyeballs aiosignal attrs idna \
  typing_extensions nvidia-ml-py -d "$out/wheels"
for pyver in 3.10 3.11 3.12 3.13; do
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --python-version "$pyver" \
    xxhash psutil aiohttp frozenlist multidict propcache yarl -d "$out/wheels"
done
ls -la "$out" "$out/wheels"
# The key of a CUDA build carried back from the GPU machine (tests/gpu/llama_cuda.py: export()).
mkdir -p "$out/llama-cuda"
sha256sum "$out/llama-src.tar.xz" >"$out/llama-cuda/llama-src.sha256"
