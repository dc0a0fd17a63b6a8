"""``sapiens2 serve`` (``docs/serving.md``): an HTTP inference service on Ray Serve with dynamic batching, and its client."""
