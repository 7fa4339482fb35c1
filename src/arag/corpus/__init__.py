"""Paper sources: QASPER, local PDFs, arXiv selection."""
