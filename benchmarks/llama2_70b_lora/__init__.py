"""Llama 2 70B LoRA fine-tuning on SCROLLS GovReport (MLPerf llama2_70b_lora)."""
