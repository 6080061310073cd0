"""The package version, importable from any layer without importing the package's API."""

__version__ = "0.1.0"
