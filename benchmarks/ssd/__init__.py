"""SSD-ResNet34 on COCO 2017 (MLPerf key `ssd`, rulesets 0.6.0-1.1.0): building blocks, not yet a workload."""
