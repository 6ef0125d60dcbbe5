# Sourced on a lent GPU host (scripts/gpu/run.sh does): the installed wheels and this tree on
# the path, and what vLLM 0.25.0 needs there.
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0     # flashinfer is not installed (its cubins are 1.9 GB)
export VLLM_WORKER_MULTIPROC_METHOD=spawn # CUDA initialised in a parent breaks a fork
export HF_HUB_OFFLINE=1                   # nothing can be fetched there
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # shared hosts

# wait_healthy PORT PID UNTIL POLL_S: poll http://127.0.0.1:PORT/health every POLL_S seconds
# until it answers (status 0), the server PID exits or the epoch second UNTIL passes (status 1).
wait_healthy() {
  while (( $(date +%s) < $3 )); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep "$4"
  done
  return 1
}
