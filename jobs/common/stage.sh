# Stage the Python environment on node-local storage before launch (sourced by the job scripts).
#
# Why: `import torch` opens thousands of files; thousands of ranks doing it at once on a parallel
# file system is an "import storm" that can take many minutes and slow the file system for
# everyone. Copying one tar file per node and importing from local disk avoids it.
#
# How (HPCTRAIN_STAGE=1):
#   1. pack once, on the shared file system: HPCTRAIN_STAGE_TARS (default HPCTRAIN_HOME/.stage)
#      /env.tar (the .venv; rebuilt
#      when missing or with HPCTRAIN_STAGE_REFRESH=1) and src.tar (hpctrain, kernels,
#      data_tools; repacked every job, it is small; --transform puts kernels/ and data_tools/
#      at src/hpctrain/kernels and src/hpctrain/data_tools, where an installed hpctrain has them,
#      so PYTHONPATH=<dir>/src imports all three from the copy, not through the editable install);
#   2. copy to every node: Slurm `sbcast` (tree broadcast to node-local /tmp), otherwise one
#      reader per node (`mpirun --map-by ppr:1:node`, `jsrun --rs_per_host 1`);
#   3. extract into HPCTRAIN_STAGE_DIR (default /tmp/hpctrain-JOBID; /dev/shm also works) and
#      run PY=<dir>/.venv/bin/python with PYTHONPATH=<dir>/src, which wins over the editable
#      install's path. A moved venv works with `python -m` (pyvenv.cfg is found next to bin/),
#      as long as the base interpreter (pyvenv.cfg `home`) exists on the compute nodes.
# Each step is printed instead of run under --dry-run.

hpctrain_do() {
  if [ "$DRY_RUN" = 1 ]; then hpctrain_show "$@"; else "$@"; fi
}

hpctrain_stage_pack() {
  local stage=${HPCTRAIN_STAGE_TARS:-$HPCTRAIN_HOME/.stage}
  hpctrain_do mkdir -p "$stage"
  if [ ! -f "$stage/env.tar" ] || [ "${HPCTRAIN_STAGE_REFRESH:-0}" = 1 ]; then
    hpctrain_do tar -C "$HPCTRAIN_HOME" -cf "$stage/env.tar.tmp" "${HPCTRAIN_STAGE_VENV:-.venv}"
    hpctrain_do mv "$stage/env.tar.tmp" "$stage/env.tar"
  fi
  hpctrain_do tar -C "$HPCTRAIN_HOME" -cf "$stage/src.tar" \
    --transform 's,^\(kernels\|data_tools\)\(/\|$\),hpctrain/\1\2,S;s,^,src/,S' ${HPCTRAIN_STAGE_SRC:-hpctrain kernels data_tools}
}

hpctrain_stage_use() {
  # Point the launch at the staged copy.
  PY=$STAGE_DIR/${HPCTRAIN_STAGE_VENV:-.venv}/bin/python
  APP[0]=$PY
  export PYTHONPATH=$STAGE_DIR/src${PYTHONPATH:+:$PYTHONPATH}
}

hpctrain_stage() {
  # Usage: hpctrain_stage slurm|openmpi|mpich|pals|jsrun — no-op unless HPCTRAIN_STAGE=1.
  [ "${HPCTRAIN_STAGE:-0}" = 1 ] || return 0
  STAGE_DIR=${HPCTRAIN_STAGE_DIR:-/tmp/hpctrain-${SLURM_JOB_ID:-${PBS_JOBID:-${LSB_JOBID:-$$}}}}
  local stage=${HPCTRAIN_STAGE_TARS:-$HPCTRAIN_HOME/.stage} t
  hpctrain_stage_pack
  local per_node
  case $1 in
    slurm)
      per_node=(srun --nodes="$NODES" --ntasks-per-node=1 --ntasks="$NODES")
      hpctrain_do "${per_node[@]}" mkdir -p "$STAGE_DIR"
      for t in env src; do
        hpctrain_do sbcast --force "$stage/$t.tar" "$STAGE_DIR/$t.tar"
        hpctrain_do "${per_node[@]}" tar -C "$STAGE_DIR" -xf "$STAGE_DIR/$t.tar"
        hpctrain_do "${per_node[@]}" rm -f "$STAGE_DIR/$t.tar"
      done ;;
    openmpi|mpich|pals|jsrun)
      case $1 in
        openmpi) per_node=(mpirun -n "$NODES" --map-by ppr:1:node) ;;
        mpich) per_node=("${HPCTRAIN_MPIEXEC:-$(command -v mpiexec.mpich || echo mpiexec)}" -n "$NODES" -ppn 1) ;;
        pals) per_node=(mpiexec -n "$NODES" --ppn 1) ;;
        jsrun) per_node=(jsrun --nrs "$NODES" --rs_per_host 1 --tasks_per_rs 1 --cpu_per_rs 1) ;;
      esac
      hpctrain_do "${per_node[@]}" mkdir -p "$STAGE_DIR"
      for t in env src; do
        hpctrain_do "${per_node[@]}" tar -C "$STAGE_DIR" -xf "$stage/$t.tar"
      done ;;
    *) echo "hpctrain_stage: unknown method $1" >&2; return 2 ;;
  esac
  hpctrain_stage_use
  STAGE_CLEANUP=("${per_node[@]}" rm -rf "$STAGE_DIR")
}

hpctrain_unstage() {
  [ "${HPCTRAIN_STAGE:-0}" = 1 ] && [ "${HPCTRAIN_STAGE_KEEP:-0}" != 1 ] || return 0
  hpctrain_do "${STAGE_CLEANUP[@]}" || true
}
