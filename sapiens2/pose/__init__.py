"""sapiens2.pose."""
