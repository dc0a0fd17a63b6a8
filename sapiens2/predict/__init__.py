"""sapiens2.predict."""
