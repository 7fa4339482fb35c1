"""Building and describing the library: the resumable build, build state, topics."""
