#!/usr/bin/env bash
# Per-rank launch wrapper: pick this rank's GPU by its node-local rank, then exec the command.
#   <launcher> jobs/common/bind.sh python -m hpctrain …
# The node-local rank comes from whichever launcher started us (first match wins: Open MPI,
# MVAPICH2, MPICH/Hydra, PMIx, IBM jsrun, Cray PALS, Slurm srun). SLURM_LOCALID is last because
# mpirun inside an sbatch script inherits the batch shell's SLURM_LOCALID=0 in every rank.
# GPUs: if CUDA_VISIBLE_DEVICES already lists devices (Slurm --gpus-per-node, jsrun resource
# sets), the rank takes entry local_rank mod len(list); otherwise, with HPCTRAIN_GPUS_PER_NODE=G
# > 0, device local_rank mod G. More ranks than GPUs share round-robin. hpctrain then calls
# torch.cuda.set_device on the one visible device.
set -euo pipefail
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MV2_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${PMIX_LOCAL_RANK:-${JSM_NAMESPACE_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${SLURM_LOCALID:-0}}}}}}}
export HPCTRAIN_LOCAL_RANK=$local_rank
gpus=${HPCTRAIN_GPUS_PER_NODE:-0}
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "${CUDA_VISIBLE_DEVICES}" != "NoDevFiles" ]; then
  IFS=, read -r -a devices <<< "$CUDA_VISIBLE_DEVICES"
  export CUDA_VISIBLE_DEVICES=${devices[$(( local_rank % ${#devices[@]} ))]}
elif [ "$gpus" -gt 0 ]; then
  export CUDA_VISIBLE_DEVICES=$(( local_rank % gpus ))
fi
if [ "${HPCTRAIN_BIND_VERBOSE:-0}" = 1 ]; then
  echo "bind: host $(hostname -s) local rank $local_rank CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-}" >&2
fi
exec "$@"
