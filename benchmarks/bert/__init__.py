"""BERT-large pretraining (phase 2), the MLPerf `bert` benchmark."""
