"""sapiens2.dense."""
