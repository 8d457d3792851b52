"""GSM8K grade-school math environments and their answer scoring."""
