"""MLPerf qwen35_397b_grpo: Qwen3.5-397B-A17B post-trained by GRPO on agentic coding tasks (foundations only:
the GRPO loss pieces and the Gated DeltaNet layer; not yet a registered workload)."""
