#!/usr/bin/env bash
# Install everything hpctrain needs into .venv: Debian's Open MPI and parallel HDF5, the CPU torch
# wheel, mpi4py, h5py built against that MPI (serial h5py as a loud fallback), and the project.
# Idempotent: a stamp keyed on this script and setup.cfg makes a second run instant.
# Facts behind each step: ../shared/DESIGN.md, "Environment facts".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
key=$(cat scripts/setup.sh setup.cfg pyproject.toml | sha256sum | cut -c1-16)
stamp="$VENV/.setup-$key"
[ -f "$stamp" ] && exit 0

say() { printf '[setup] %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. One MPI for everything (Debian's Open MPI), and the HDF5 built on it.
debs="openmpi-bin libopenmpi-dev libhdf5-openmpi-dev pkg-config build-essential iproute2 procps"
if ! dpkg -s $debs >/dev/null 2>&1; then
  say "installing Debian packages: $debs"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $debs >/dev/null
fi

# 2. The virtual environment; torch pinned to the CPU wheel first so nothing pulls a CUDA build.
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip="$VENV/bin/python -m pip install -q"
[ -d /opt/wheels ] && pip="$pip --find-links /opt/wheels"
say "installing torch==2.13.0 (CPU wheel)"
$pip torch==2.13.0
$pip 'Cython>=3,<4' pkgconfig 'setuptools>=77' wheel 'mpi4py>=4.1' 'numpy<3'

# 3. h5py for parallel HDF5 (driver='mpio'); --no-build-isolation keeps the build on our mpi4py.
if ! "$VENV/bin/python" -c 'import h5py,sys; sys.exit(not h5py.get_config().mpi)' 2>/dev/null; then
  say "building h5py against Debian's parallel HDF5 (about 2 minutes, once)"
  if ! HDF5_MPI=ON CC=mpicc HDF5_DIR=/usr/lib/x86_64-linux-gnu/hdf5/openmpi \
       $pip --no-build-isolation --no-binary=h5py h5py; then
    say "WARNING: parallel h5py did not build; falling back to serial h5py (per-shard reads, no mpio)"
    $pip h5py
  fi
fi

# 4. The project itself, editable, with its test tools.
say "installing hpctrain"
$pip --no-build-isolation -e '.[test,docs]'
rm -f "$VENV"/.setup-*
touch "$stamp"
say "done: $("$VENV/bin/python" -c 'import torch,mpi4py,h5py;print("torch",torch.__version__,"mpi4py",mpi4py.__version__,"h5py",h5py.__version__,"mpi" if h5py.get_config().mpi else "serial")')"
