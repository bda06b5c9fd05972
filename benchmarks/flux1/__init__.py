"""FLUX.1 text-to-image pretraining (MLPerf flux1): an MMDiT trained from scratch by rectified flow."""
