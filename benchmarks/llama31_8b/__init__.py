"""Llama 3.1 8B pretraining (MLPerf llama31_8b)."""
