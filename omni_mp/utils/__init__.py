"""What both planes use: `procs` (child processes that die with their parent, prompt exits) and
`gpu_memory` (what a GPU holds, from NVML)."""
