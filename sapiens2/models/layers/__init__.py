"""sapiens2.models.layers."""
