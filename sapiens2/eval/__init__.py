"""sapiens2.eval."""
