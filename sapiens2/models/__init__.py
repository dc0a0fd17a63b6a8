"""sapiens2.models."""
