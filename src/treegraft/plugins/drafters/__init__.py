"""Built-in drafters."""
