from harness.cli import entry_point

entry_point()
