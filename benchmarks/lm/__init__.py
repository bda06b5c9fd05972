"""What the decoder language models (gpt_oss_20b, llama31_8b) share: the decoder stack, attention, SwiGLU, the
base model config, the data readers and the synthetic language, the common workload. Not a workload: the
registry never names it."""
