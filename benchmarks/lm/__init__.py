"""What the decoder language models (gpt_oss_20b, llama31_8b) share: attention, the data readers and the
synthetic language. Not a workload: the registry never names it."""
