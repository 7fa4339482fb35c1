"""The ``arag`` command line."""
