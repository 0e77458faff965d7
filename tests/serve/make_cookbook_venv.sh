#!/bin/sh
# make_cookbook_venv.sh TORCH_PYTHON VENV: the test venv of the tinker-cookbook
# test (test_tinker_cookbook.py). tinker-cookbook 0.6.1 is installed with
# --no-deps: it declares tml-renderers>=0.4.1, which is not published (PyPI has
# 0.2.1 at most), so pip cannot resolve it; the chat_sl and math_rl recipes
# never import it (only the Inkling / Kimi K3 tokenizers do). Then exactly what
# those two recipes import: the tinker SDK 0.38.0 (it brings transformers,
# numpy, rich, pydantic), chz, datasets, blobfile, termcolor, pillow, and
# math_rl's sympy and pylatexenc. torch (imported by the cookbook's supervised
# code) is the project's, seen through a .pth file, so no second torch is
# downloaded. Not installed, and not imported by these recipes: tml-renderers,
# tiktoken, pyrage, cloudpickle, aiohttp. Nothing to do when everything
# imports already; when PyPI cannot be reached the venv stays without it and
# the test skips.
set -u
torch_python=$1 venv=$2
modules="tinker_cookbook, tinker, torch, transformers, chz, datasets, blobfile, termcolor, PIL, sympy, pylatexenc"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $modules" 2>/dev/null; then
    echo "test venv $venv already has tinker-cookbook"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    "$torch_python" -m venv "$venv" || { echo "cannot create the venv $venv"; exit 1; }
fi
torch_site=$("$torch_python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))") ||
    { echo "$torch_python cannot import torch; the tinker-cookbook test skips"; exit 0; }
venv_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$torch_site" > "$venv_site/_rl_project_torch.pth"
pip="$venv/bin/python -m pip install --quiet --disable-pip-version-check"
if $pip --no-deps tinker-cookbook==0.6.1 &&
   $pip tinker==0.38.0 chz datasets blobfile termcolor pillow sympy pylatexenc; then
    echo "test venv $venv: installed tinker-cookbook 0.6.1 (--no-deps) and what its recipes import"
else
    echo "test venv $venv: could not install tinker-cookbook (no PyPI?); the test skips"
fi
exit 0
