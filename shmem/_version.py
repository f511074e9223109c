"""The package version (one place; read by pyproject.toml)."""

__version__ = "0.1.0"
