"""Question answering with two tools, search and Python, scored on a final ``#### <number>`` answer."""
