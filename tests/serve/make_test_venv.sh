#!/bin/sh
# make_test_venv.sh PYTHON VENV PACKAGE...: the test venv with PACKAGE(s) from
# PyPI. Nothing to do when they import already; when PyPI cannot be reached
# the venv stays without them and the tests that need them skip.
set -u
python=$1 venv=$2
shift 2
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $(echo "$@" | tr ' ' ',')" 2>/dev/null; then
    echo "test venv $venv already has $*"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || { echo "cannot create the venv $venv"; exit 1; }
fi
if "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; then
    echo "test venv $venv: installed $*"
else
    echo "test venv $venv: could not install $* (no PyPI?); the tests that need them skip"
fi
exit 0
