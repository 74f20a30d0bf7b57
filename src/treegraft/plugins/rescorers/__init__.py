"""Built-in rescorers."""
