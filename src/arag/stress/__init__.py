"""Reliability tests run against the real CLI: crash-resume of builds, ingestion of bad PDFs."""
