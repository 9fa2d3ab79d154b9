#!/usr/bin/env bash
# Build llama.cpp's llama-server for `tinyloop bench --concurrency/--chat-turns` and install it
# where the bench looks for it when no llama-server is on PATH:
#     ${XDG_CACHE_HOME:-~/.cache}/tinyloop/llama-server/llama-server
# The source is the llama.cpp tree vendored in llama-cpp-python's source distribution, fetched
# from PyPI with pip (no other internet access needed). CPU only, native ISA, no curl.
# Takes several minutes on 2 cores. Prints the installed binary's path on its last line.
#
# Environment:
#   PIP                 pip to download with (default: .venv/bin/pip if present, else python3 -m pip)
#   LLAMA_CPP_PYTHON    version spec of llama-cpp-python to take the sources from (default: the
#                       version installed in the venv, else the newest)
#   JOBS                parallel build jobs (default 2)
#   LLAMA_SERVER_DIR    install folder (default ${XDG_CACHE_HOME:-~/.cache}/tinyloop/llama-server)
#   KEEP_BUILD=1        keep the work folder (sources and build tree) instead of deleting it
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in cmake tar; do
    command -v "$tool" >/dev/null || { echo "build_llama_server.sh: $tool not found (apt-get install cmake build-essential)" >&2; exit 1; }
done
command -v c++ >/dev/null || command -v g++ >/dev/null || { echo "build_llama_server.sh: no C++ compiler (apt-get install build-essential)" >&2; exit 1; }

if [[ -n "${PIP:-}" ]]; then read -r -a pip <<<"$PIP"
elif [[ -x .venv/bin/pip ]]; then pip=(.venv/bin/pip)
else pip=(python3 -m pip); fi

spec="llama-cpp-python"
if [[ -n "${LLAMA_CPP_PYTHON:-}" ]]; then
    spec="llama-cpp-python${LLAMA_CPP_PYTHON}"
    [[ "$LLAMA_CPP_PYTHON" =~ ^[0-9] ]] && spec="llama-cpp-python==${LLAMA_CPP_PYTHON}"
elif ver=$("${pip[@]}" show llama-cpp-python 2>/dev/null | awk '/^Version:/{print $2}') && [[ -n "$ver" ]]; then
    spec="llama-cpp-python==${ver}"
fi

dest="${LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tinyloop/llama-server}"
jobs="${JOBS:-2}"
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
if [[ "${KEEP_BUILD:-0}" != 1 ]]; then trap 'rm -rf "$work"' EXIT; else echo "work folder: $work" >&2; fi

echo "== downloading the $spec source distribution" >&2
"${pip[@]}" download "$spec" --no-deps --no-binary :all: -d "$work/dl" >&2
sdist=$(find "$work/dl" -maxdepth 1 -name '*.tar.gz' | head -1)
[[ -n "$sdist" ]] || { echo "build_llama_server.sh: pip downloaded no source tarball" >&2; exit 1; }
tar -xzf "$sdist" -C "$work"
src=""
for candidate in "$work"/llama_cpp_python-*/vendor/llama.cpp "$work"/llama-cpp-python-*/vendor/llama.cpp; do
    [[ -f "$candidate/CMakeLists.txt" ]] && { src="$candidate"; break; }
done
[[ -n "$src" ]] || { echo "build_llama_server.sh: no vendor/llama.cpp in $sdist" >&2; exit 1; }

# Options differ across llama.cpp versions: pass only those the vendored tree declares.
opts=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
has_opt() { grep -rqs --include=CMakeLists.txt --include='*.cmake' "option($1\b" "$src/CMakeLists.txt" "$src/ggml/CMakeLists.txt" "$src/cmake" 2>/dev/null; }
for o in LLAMA_BUILD_SERVER LLAMA_BUILD_EXAMPLES LLAMA_BUILD_TOOLS; do has_opt "$o" && opts+=("-D$o=ON"); done
for o in LLAMA_CURL LLAMA_OPENSSL LLAMA_BUILD_TESTS GGML_CUDA GGML_VULKAN GGML_METAL; do
    has_opt "$o" && opts+=("-D$o=OFF")
done
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

echo "== configuring $src: ${opts[*]}" >&2
cmake -S "$src" -B "$work/build" "${gen[@]}" "${opts[@]}" >&2
echo "== building llama-server with $jobs jobs" >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2

bin=$(find "$work/build" -type f -name llama-server -perm -u+x | head -1)
[[ -n "$bin" ]] || { echo "build_llama_server.sh: the build produced no llama-server binary" >&2; exit 1; }
mkdir -p "$dest"
install -m 0755 "$bin" "$dest/llama-server.new"
mv -f "$dest/llama-server.new" "$dest/llama-server"
"$dest/llama-server" --version >&2 2>&1 || true
echo "$dest/llama-server"
