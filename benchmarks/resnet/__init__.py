"""ResNet-50 v1.5 on ImageNet (MLPerf key `resnet`)."""
