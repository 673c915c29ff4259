"""One module per public dataset source: its loader (and, for new sources, its declaration)."""
