"""arag: an adaptive retrieval-augmented research assistant."""

__version__ = "0.1.0"
