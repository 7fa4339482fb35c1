"""The HTTP service: FastAPI app, SSE streaming, ingest jobs and the web page."""

from arag.service.app import create_app

__all__ = ["create_app"]
