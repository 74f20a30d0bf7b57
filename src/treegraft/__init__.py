"""treegraft: lossless tree-based speculative decoding with several drafters sharing one draft tree."""

__version__ = "0.1.0"
