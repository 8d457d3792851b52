"""LiveCodeBench code-generation environment: code extraction, harnesses and output comparison."""
