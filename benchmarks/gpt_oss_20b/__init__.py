"""MLPerf gpt_oss_20b: the GPT-OSS mixture-of-experts decoder, with expert parallelism on a mesh."""
