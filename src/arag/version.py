"""The package version, a leaf module so any floor can name it without importing the package."""

__version__ = "0.1.0"
