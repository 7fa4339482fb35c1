"""The index: one store holding dense and BM25 vectors for every chunk."""
