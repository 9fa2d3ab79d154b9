#!/usr/bin/env bash
# Fill .whl/ (ignored by git) with the wheels scripts/gpu_check.sh installs on a GPU machine
# that reaches no package registry: Python 3.12, x86-64 Linux. Run it where pip reaches PyPI.
# The GPU machine this project is lent already has NumPy, tokenizers, pytest, httpx and
# CuPy for CUDA 13; what TinyLoop needs beyond those is orjson.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl orjson
ls -l .whl
