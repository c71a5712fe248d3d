"""Running at scale: the vLLM engine (vllm_engine.py), torchrun/DDP/FSDP helpers (distributed.py) and
checkpoints (checkpoint.py)."""
