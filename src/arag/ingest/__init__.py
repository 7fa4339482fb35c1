"""Turning papers into chunks: sentence splitting and chunk assembly."""
