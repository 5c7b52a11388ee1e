"""The package version, in a leaf module so every layer can read it without a cycle."""

__version__ = "0.1.0"
