"""Built-in builders."""
