"""Retrieval: hybrid search over the one store, fusion, reranking."""
