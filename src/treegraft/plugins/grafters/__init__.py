"""Built-in grafters."""
