"""Not vLLM: the one module path test_vllm_transfer.py needs from it, so that
pickle writes and reads vLLM's ncclUniqueId as vLLM's own processes do,
without vLLM installed."""
