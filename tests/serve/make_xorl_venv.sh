#!/bin/sh
# make_xorl_venv.sh PYTHON VENV: the test venv of the xorl-client test. The
# client itself (xorl-client 0.1.0, unmodified) without its declared extras
# (datasets, tinker-cookbook: the client code imports neither), plus what its
# modules import. Nothing to do when xorl_client imports already; when PyPI
# cannot be reached the venv stays without it and the test skips.
set -u
python=$1 venv=$2
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import xorl_client" 2>/dev/null; then
    echo "test venv $venv already has xorl_client"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || { echo "cannot create the venv $venv"; exit 1; }
fi
pip="$venv/bin/python -m pip install --quiet --disable-pip-version-check"
if $pip --no-deps xorl-client==0.1.0 &&
   $pip httpx pydantic numpy requests typing-extensions; then
    echo "test venv $venv: installed xorl-client 0.1.0"
else
    echo "test venv $venv: could not install xorl-client (no PyPI?); the test skips"
fi
exit 0
