#!/bin/sh
# make_peer_venv.sh VENV [TORCH_PYTHON]: a venv in which tests/peers/generate.py
# imports the peers' modules. It sees the torch of TORCH_PYTHON (default: the
# project venv .venv/bin/python, through a .pth file, so no second torch is
# downloaded) and gets from PyPI the packages verl's and AReaL's modules import
# at import time (verl, AReaL, prime-rl, xorl, Surogate; the generator runs none of their
# distributed code).
set -eu
venv=$1
torch_python=${2:-$(dirname "$0")/../../.venv/bin/python}
[ -x "$venv/bin/python" ] || "$torch_python" -m venv "$venv"
torch_site=$("$torch_python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
venv_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$torch_site" > "$venv_site/_rl_project_torch.pth"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    numpy omegaconf packaging 'tensordict>=0.8.0,<=0.10.0,!=0.9.0' 'transformers<5' \
    codetiming ray hydra-core uvloop aiohttp httpx colorlog tenacity flask torchdata lark \
    numba pillow einops aiofiles openai beartype jaxtyping wandb 'prime-pydantic-config>=0.4.3' \
    'datasets<4' 'huggingface-hub<1.0' tensorboardX tabulate pybase64 addict
echo "peer venv $venv ready"
