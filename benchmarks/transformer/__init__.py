"""Transformer (WMT En-De), the MLPerf `transformer` benchmark."""
