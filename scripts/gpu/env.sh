# Sourced on a lent GPU host (scripts/gpu/run.sh does): the installed wheels and this tree on
# the path, and what vLLM 0.25.0 needs there.
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0     # flashinfer is not installed (its cubins are 1.9 GB)
export VLLM_WORKER_MULTIPROC_METHOD=spawn # CUDA initialised in a parent breaks a fork
export HF_HUB_OFFLINE=1                   # nothing can be fetched there
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # shared hosts
