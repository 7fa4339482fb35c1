"""Swappable models behind small protocols (embedders now; rerankers and LLMs later)."""
