"""sapiens2: a fast, checkpoint-exact implementation of Meta's Sapiens2 human-centric vision transformers."""

__version__ = "0.1.0"
