#!/bin/bash
# plot-setup.sh: make sure testharness/plot.py can run: a python3 (the one on PATH, or the
# system's /usr/bin/python3) that imports matplotlib. Installs Debian's python3-matplotlib when
# neither does (as root; otherwise prints the command). testharness/run-tests.sh runs this.
set -euo pipefail
for py in python3 /usr/bin/python3; do
    if command -v "$py" > /dev/null 2>&1 && "$py" -c 'import matplotlib' 2> /dev/null; then
        exit 0
    fi
done
if [ "$(id -u)" != 0 ]; then
    echo "plot-setup: no python3 with matplotlib; run as root, or: sudo apt-get install -y python3-matplotlib (or pip install matplotlib)" >&2
    exit 1
fi
echo "plot-setup: installing python3-matplotlib" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends python3-matplotlib >&2; then
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends python3-matplotlib >&2
fi
/usr/bin/python3 -c 'import matplotlib' || { echo "plot-setup: matplotlib still missing" >&2; exit 1; }
