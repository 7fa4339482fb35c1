"""Benchmarks: commands that print figures and can write JSON."""
