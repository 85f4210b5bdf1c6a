#!/usr/bin/env bash
# Download the wheels of bench/device-wheels.txt into .whl/ (ignored by git: add `/.whl/` to
# .git/info/exclude), for the GPU machine's Python: CPython 3.12, x86-64 manylinux. No
# dependency resolution (--no-deps): the list is the whole closure. Prints the total size.
#
#   bench/fetch-device-wheels.sh [DEST]      (default .whl)
#
# DEVICE_PYTHON=3.11 fetches the same pins for another CPython (to rehearse the device run on a
# machine whose Python is not 3.12).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest="${1:-.whl}"
pyver="${DEVICE_PYTHON:-3.12}"
mkdir -p "$dest"
grep -v '^\s*#' bench/device-wheels.txt | grep -v '^\s*$' | while read -r pin; do
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 --platform any \
    -d "$dest" "$pin"
done
count=$(ls "$dest"/*.whl | wc -l)
expected=$(grep -cv '^\s*\(#\|$\)' bench/device-wheels.txt)
echo "fetch-device-wheels: $count wheels ($expected pinned) in $dest, $(du -sh "$dest" | cut -f1)"
[[ "$count" -eq "$expected" ]] || { echo "fetch-device-wheels: $dest holds $count wheels, expected $expected (one version of each)" >&2; exit 1; }
