# The README's commands. `make demo`: install everything into .venv, run the default job on 2 ranks.
# `make test`: install if needed, run serial tests, then the MPI tests at -n 2 and -n 4.
VENV     ?= .venv
PY       := $(VENV)/bin/python
NP       ?= 2
MPIEXEC  ?= mpiexec
# Open MPI as root, oversubscribed on a 2-core machine; one compute thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMP_NUM_THREADS := 1
PYTEST_MPI := -m pytest --only-mpi -q -p no:cacheprovider --color=no --timeout=300

.PHONY: setup demo test test-serial test-mpi test-slurm docs bench clean
setup:
	@bash scripts/setup.sh

demo: setup
	$(MPIEXEC) -n $(NP) $(PY) -m hpctrain --run-dir runs/demo

test: setup
	$(MAKE) --no-print-directory test-serial
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory test-mpi
	$(MAKE) --no-print-directory test-slurm

# The documentation site (mkdocs.yml, docs/, API pages from the docstrings by static analysis:
# no MPI or torch import) into site/; --strict: a warning (broken link, bad docstring) fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet -d site && echo "== [docs] built site/ (open site/index.html)"

test-serial:
	$(PY) -m pytest -q tests/unit tests/kernels tests/integration

test-mpi:
	for n in 2 4; do $(MPIEXEC) -n $$n $(PY) $(PYTEST_MPI) tests/mpi || exit 1; done

# One-node Slurm on this host (installs slurm-wlm + munge once), then the batch scripts under it.
test-slurm: setup
	@bash scripts/slurm/start.sh || echo "[test-slurm] Slurm could not be started: its tests will be skipped"
	HPCTRAIN_TEST_SLURM=1 $(PY) -m pytest -q -rs tests/integration/test_ops_slurm.py

bench: setup
	$(MPIEXEC) -n 2 $(PY) -m hpctrain bench allreduce
	$(MPIEXEC) -n 2 $(PY) -m hpctrain bench sync
	$(PY) -m hpctrain bench kernels

clean:
	rm -rf runs .pytest_cache
