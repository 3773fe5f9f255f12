#!/bin/sh
# Compiles the simulator's hot modules (setup.py's list) with mypyc in place: each .so sits next to its .py and is
# imported instead; the same results bit for bit, 2-2.6x faster (bench/compiled.py). `--clean` removes them (back
# to pure Python). Needs a C compiler and mypy (the dev extra's); about a minute on 2 cores.
#   bash scripts/compile.sh [--clean]        PY=.venv/bin/python by default
set -e
cd "$(dirname "$0")/.."
find capacity -name '*.so' -delete
rm -rf build
[ "${1:-}" = "--clean" ] && exit 0
CAPACITY_MYPYC=1 "${PY:-.venv/bin/python}" setup.py -q build_ext --inplace
"${PY:-.venv/bin/python}" -c "import capacity, sys; sys.exit(0 if capacity.compiled() else 'not compiled')"
echo "compiled: $(find capacity -name '*.so' | wc -l) modules"
