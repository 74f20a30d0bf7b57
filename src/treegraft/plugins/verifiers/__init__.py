"""Built-in verifiers."""
