#!/bin/sh
# make_peft_venv.sh TORCH_PYTHON VENV: the test venv of the PEFT cross-check.
# It sees the torch of TORCH_PYTHON (the project venv, through a .pth file, so
# no second torch is downloaded) and gets numpy, transformers and peft from
# PyPI. Nothing to do when they import already; when PyPI cannot be reached
# the venv stays without them and the test skips.
set -u
torch_python=$1 venv=$2
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, transformers, peft" 2>/dev/null; then
    echo "test venv $venv already has torch, transformers and peft"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    "$torch_python" -m venv "$venv" || { echo "cannot create the venv $venv"; exit 1; }
fi
torch_site=$("$torch_python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))") ||
    { echo "$torch_python cannot import torch; the PEFT test skips"; exit 0; }
venv_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$torch_site" > "$venv_site/_rl_project_torch.pth"
if "$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy transformers peft; then
    echo "test venv $venv: installed numpy, transformers, peft"
else
    echo "test venv $venv: could not install transformers / peft (no PyPI?); the PEFT test skips"
fi
exit 0
