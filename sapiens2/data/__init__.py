"""sapiens2.data."""
