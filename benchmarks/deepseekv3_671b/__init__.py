"""MLPerf deepseekv3_671b: DeepSeek-V3 (MLA, a group-limited sigmoid-routed MoE with a shared expert) continued
pre-training from a Hugging Face checkpoint."""
