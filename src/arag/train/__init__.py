"""Training arag's own models (the reranker) from the packaged weights and QASPER train."""
