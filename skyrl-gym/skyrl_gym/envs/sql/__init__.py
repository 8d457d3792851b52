"""Text-to-SQL environment: response format checks and read-only SQLite scoring."""
