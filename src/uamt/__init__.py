"""uamt: uncertainty-aware machine-translation evaluation."""

__version__ = "0.1.0"
