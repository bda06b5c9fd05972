"""MLPerf Training 6.1 dlrmv4: an HSTU ranker over sharded embedding tables (Yambda-5B)."""
