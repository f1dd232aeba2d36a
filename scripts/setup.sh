#!/usr/bin/env bash
# Install everything hpctrain needs into a virtual environment bound to ONE MPI implementation:
#   MPI=openmpi (default) -> .venv        Debian's Open MPI 4.1 + libhdf5-openmpi
#   MPI=mpich             -> .venv-mpich  Debian's MPICH 4.0 (hydra mpiexec) + libhdf5-mpich
# Each gets torch, mpi4py, h5py built against that MPI's parallel HDF5 (serial h5py as a loud
# fallback), and the project. VENV overrides the directory.
# torch: the CPU wheel, unless this is a GPU node (scripts/gpu_choice.py: GPU=auto (default) asks
# `nvidia-smi -L`; GPU=1 / GPU=0 decide; CUDA=12|13 overrides the driver's CUDA major): then the
# CUDA build for the driver (cu126 for 12.x drivers, cu130 for 13.x) from the PyTorch wheel index,
# and the matching CuPy (extra `cuda`: cupy-cuda12x, `cuda13`: cupy-cuda13x).
# DRY_RUN=1 prints that choice and what would be installed, and changes nothing.
# Idempotent: a stamp keyed on this script, setup.cfg, setup.py, pyproject.toml, MPI and the torch flavour
# makes a second run instant.
# Facts behind each step: docs/environment.md ("MPI"); README "MPI implementations".
set -euo pipefail
cd "$(dirname "$0")/.."
MPI=${MPI:-openmpi}
case "$MPI" in
  openmpi) VENV=${VENV:-.venv};       debs="openmpi-bin libopenmpi-dev libhdf5-openmpi-dev" ;;
  mpich)   VENV=${VENV:-.venv-mpich}; debs="mpich libmpich-dev libhdf5-mpich-dev" ;;
  *) echo "[setup] MPI=$MPI: choose openmpi or mpich" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
say() { printf '[setup %s +%ss] %s\n' "$MPI" "$SECONDS" "$*"; }   # seconds since set-up began

# 0. CPU or GPU: the torch flavour (cpu | cu126 | cu130) and the CuPy extra (- | cuda | cuda13).
choice=$(GPU="${GPU:-auto}" CUDA="${CUDA:-}" "$PY" scripts/gpu_choice.py) || exit 2
read -r flavour cuda_extra reason <<<"$choice"
if [ "$flavour" = cpu ]; then
  torch_what="torch==2.13.0 (CPU wheel; $reason)"
else
  torch_what="torch==2.13.0+$flavour (CUDA build from https://download.pytorch.org/whl/$flavour; $reason)"
fi
# The project's extras: `test` carries cupy-cuda12x (NVRTC compiles in CPU CI), which cannot sit
# beside cupy-cuda13x, so a CUDA 13 node and the MPICH venv take the test tools by name.
extras=docs
tools=('pytest>=8' 'pytest-mpi>=0.6' 'pytest-timeout>=2.3' 'pytest-xdist>=3' 'tensorboard>=2.14' 'safetensors>=0.4')
if [ "$MPI" = openmpi ] && [ "$cuda_extra" != cuda13 ]; then extras="test,$extras"; tools=(); fi
[ "$cuda_extra" != - ] && extras="$extras,$cuda_extra"
installer=${HPCTRAIN_INSTALLER:-uv}     # step 2 says why uv
case "$installer" in uv|pip) ;; *) echo "[setup] HPCTRAIN_INSTALLER=$installer: choose uv or pip" >&2; exit 2 ;; esac
if [ "${DRY_RUN:-0}" = 1 ]; then
  say "dry run: $torch_what"
  say "dry run: hpctrain[$extras] ${tools[*]}"
  say "dry run: installed with $installer"
  exit 0
fi

key=$( (cat scripts/setup.sh scripts/gpu_choice.py setup.cfg setup.py pyproject.toml; echo "$MPI $flavour") | sha256sum | cut -c1-16)
stamp="$VENV/.setup-$key"
[ -f "$stamp" ] && exit 0
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. One MPI for everything in this venv (from Debian), and the HDF5 built on it. Debian's
#    alternatives keep `mpiexec`/`mpicc` pointing at Open MPI when both are installed; MPICH is
#    always called by its own names (mpiexec.mpich, mpicc.mpich).
debs="$debs pkg-config build-essential iproute2 procps"
if ! dpkg -s $debs >/dev/null 2>&1; then
  say "installing Debian packages: $debs"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $debs >/dev/null
fi

# 2. The virtual environment; torch pinned first (CPU wheel, or the GPU node's CUDA build) so
#    nothing else pulls a different build.
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
vpy="$VENV/bin/python"
#    Installs go through uv (PyPI's `uv`, a pip-compatible installer, put into the venv by its own
#    pip): it keeps unpacked wheels in its cache (~/.cache/uv) and links them into a new venv, so
#    a second venv on the same machine (a fresh clone) takes 28-39 s where pip took 81-87 s
#    (docs/development.md). uv reads no pip configuration: a PIP_INDEX_URL (a site's mirror) is
#    passed on as UV_DEFAULT_INDEX. It compiles the bytecode as pip does (--compile-bytecode): with
#    PYTHONDONTWRITEBYTECODE set, as on this machine, a venv without it compiles torch's sources at
#    every import (2.0 -> 4.3 s a process, measured). HPCTRAIN_INSTALLER=pip, or a pip that cannot
#    fetch uv, keeps pip.
links=""; [ -d /opt/wheels ] && links="--find-links /opt/wheels"
if [ "$installer" = uv ] && ! { [ -x "$VENV/bin/uv" ] || "$vpy" -m pip install -q 'uv>=0.9' $links; }; then
  say "uv could not be installed: installing with pip"; installer=pip
fi
if [ "$installer" = uv ]; then
  [ -n "${PIP_INDEX_URL:-}" ] && export UV_DEFAULT_INDEX=${UV_DEFAULT_INDEX:-$PIP_INDEX_URL}
  pip="$VENV/bin/uv pip install -q --compile-bytecode --python $vpy $links"
else
  pip="$vpy -m pip install -q $links"
fi
installed=$("$vpy" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ -n "$installed" ] && "$PY" scripts/gpu_choice.py --replaces "$installed" "$flavour"; then
  say "removing torch $installed (a CUDA build; pip would keep it for torch==2.13.0)"
  "$vpy" -m pip uninstall -y -q torch
fi
say "installing $torch_what"
if [ "$flavour" = cpu ]; then
  $pip torch==2.13.0
else
  $pip "torch==2.13.0+$flavour" --index-url "https://download.pytorch.org/whl/$flavour"
fi
$pip 'Cython>=3,<4' pkgconfig 'setuptools>=77' wheel 'numpy<3'

# 3. mpi4py's binary wheel carries two extension modules, MPI.openmpi (NEEDED libmpi.so.40) and
#    MPI.mpich (NEEDED libmpi.so.12), and picks one by the first libmpi it can dlopen: one already
#    in the process, then MPI4PY_LIBMPI, then <venv>/lib/libmpi.so{,.12,.40}, then the system's
#    libmpi.so (Debian's alternative: Open MPI). Debian's MPICH ships its library only as
#    libmpich.so.12, so for MPICH the venv gets a 16-byte shim <venv>/lib/libmpi.so.12 (SONAME
#    libmpi.so.12, NEEDED libmpich.so.12): mpi4py finds it first and MPI.mpich links against it.
#    If that ever fails, mpi4py is compiled with mpicc.mpich instead (3+ CPU minutes).
#    That source build goes through pip with --no-cache-dir: a wheel cache (pip's or uv's) would hand
#    one MPI's build to the other venv.
is_bound() { "$vpy" -c "import sys; from mpi4py import MPI; sys.exit('$1' not in MPI.Get_library_version())" 2>/dev/null; }
$pip 'mpi4py>=4.1'
if [ "$MPI" = mpich ]; then
  if [ ! -e "$VENV/lib/libmpi.so.12" ]; then
    shim=$(mktemp -d)
    echo 'int hpctrain_libmpi_shim;' > "$shim/shim.c"
    gcc -shared -fPIC -o "$VENV/lib/libmpi.so.12" -Wl,-soname,libmpi.so.12 -Wl,--no-as-needed \
        "$shim/shim.c" -L/usr/lib/x86_64-linux-gnu -lmpich
    rm -rf "$shim"
  fi
  if ! is_bound MPICH; then
    say "mpi4py's wheel did not load MPICH: compiling mpi4py with mpicc.mpich (a few minutes, once)"
    MPICC=mpicc.mpich "$vpy" -m pip install -q --no-cache-dir --no-build-isolation --no-binary=mpi4py \
      --force-reinstall --no-deps 'mpi4py>=4.1'
  fi
fi
is_bound "$([ "$MPI" = mpich ] && echo MPICH || echo 'Open MPI')" || { say "ERROR: mpi4py is not bound to $MPI"; exit 1; }

# 4. h5py for parallel HDF5 (driver='mpio'); --no-build-isolation keeps the build on our mpi4py.
#    Its C files compile on every core: setuptools reads [build_ext] parallel from the extra config
#    file DIST_EXTRA_CONFIG names (h5py's cythonize step before it stays serial; 145 -> 105 s here).
#    nproc counts without OMP_NUM_THREADS, which it honours and the Makefile sets to 1.
#    The wheel is kept in a cache keyed by everything its binary depends on: this MPI's full
#    library version string (as mpi4py reports it), the parallel HDF5 package's version, h5py's
#    version and the Python tag; a second venv on the same machine (a fresh clone) installs it in
#    seconds, and a machine without it (or with another MPI build) compiles it. HPCTRAIN_WHEEL_CACHE
#    moves the cache; an empty value turns it off.
if ! "$vpy" -c 'import h5py,sys; sys.exit(not h5py.get_config().mpi)' 2>/dev/null; then
  src=$(mktemp -d); sdist=""
  fetch_sdist() {   # h5py's source release matching $1; sets $sdist and $h5py_version
    $vpy -m pip download -q --no-deps --no-binary=h5py -d "$src" "$1" >/dev/null
    sdist=$(ls "$src"/h5py-*.tar.gz)
    h5py_version=$(basename "$sdist" .tar.gz); h5py_version=${h5py_version#h5py-}
  }
  #    The version comes from pip's resolver report on the binary wheels (a second): downloading
  #    the source release prepares its metadata in a build environment (12 s here), so that is
  #    done only to build, or where no wheel says the version.
  h5py_version=$($vpy -m pip install -q --dry-run --no-deps --ignore-installed --only-binary=:all: --report - \
    "h5py${H5PY_SPEC:-}" 2>/dev/null | $vpy -c 'import json,sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' \
    2>/dev/null) || fetch_sdist "h5py${H5PY_SPEC:-}"
  lib=$("$vpy" -c 'from mpi4py import MPI; print(MPI.Get_library_version().replace(chr(0), "").splitlines()[0].strip())')
  hdf5=$(dpkg-query -W -f '${Version}' "libhdf5-$MPI-dev")
  pytag=$("$vpy" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheel_key="h5py $h5py_version | $lib | libhdf5-$MPI-dev $hdf5 | $pytag"
  cache=${HPCTRAIN_WHEEL_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain/wheels}
  slot=""
  if [ -n "$cache" ]; then
    slot="$cache/h5py-$h5py_version-$MPI-$(printf '%s' "$wheel_key" | sha256sum | cut -c1-16)"
  fi
  if [ -n "$slot" ] && [ "$(cat "$slot/key" 2>/dev/null)" = "$wheel_key" ] && ls "$slot"/h5py-*.whl >/dev/null 2>&1; then
    say "installing h5py from the wheel cache ($slot: $wheel_key)"
    $pip --no-deps "$slot"/h5py-*.whl
  else
    say "building h5py against Debian's parallel HDF5 for $MPI (about 2 minutes, once per machine: $wheel_key)"
    par_cfg=$(mktemp)
    printf '[build_ext]\nparallel = %s\n' "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" > "$par_cfg"
    [ -n "$sdist" ] || fetch_sdist "h5py==$h5py_version"
    if DIST_EXTRA_CONFIG=$par_cfg HDF5_MPI=ON CC=mpicc.$MPI HDF5_DIR=/usr/lib/x86_64-linux-gnu/hdf5/$MPI \
         $vpy -m pip wheel -q --no-cache-dir --no-build-isolation --no-deps -w "$src/built" "$sdist"; then
      $pip --no-deps "$src"/built/h5py-*.whl
      if [ -n "$slot" ]; then       # written aside, then renamed: a half-written slot is never served
        mkdir -p "$cache" && tmp_slot=$(mktemp -d "$cache/.tmp-XXXXXX")
        cp "$src"/built/h5py-*.whl "$tmp_slot"/ && printf '%s' "$wheel_key" > "$tmp_slot/key"
        rm -rf "$slot" && mv "$tmp_slot" "$slot" && say "h5py wheel cached in $slot"
      fi
    else
      say "WARNING: parallel h5py did not build; falling back to serial h5py (per-shard reads, no mpio)"
      $pip h5py
    fi
    rm -f "$par_cfg"
  fi
  rm -rf "$src"
fi

# 5. The project itself, editable, with its test tools (the MPICH venv skips the CPU CI's CuPy: it
#    runs the MPI tests, not the kernel tests; on a GPU node both get the CuPy for the driver).
say "installing hpctrain[$extras]"
$pip --no-build-isolation -e ".[$extras]" "${tools[@]}"
rm -f "$VENV"/.setup-*
touch "$stamp"
say "done ($VENV): $("$vpy" -c 'import torch,mpi4py,h5py; from mpi4py import MPI; print("torch",torch.__version__,"(CUDA "+str(torch.version.cuda)+")" if torch.version.cuda else "(CPU)","mpi4py",mpi4py.__version__,"on"," ".join(MPI.Get_library_version().split()[:3]),"| h5py",h5py.__version__,"mpi" if h5py.get_config().mpi else "serial")')"
