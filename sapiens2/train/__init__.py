"""sapiens2.train."""
