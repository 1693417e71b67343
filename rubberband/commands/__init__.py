"""One module per CLI command; each defines ``register(app)`` and an optional ``ORDER``."""
