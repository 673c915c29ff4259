"""Developer tools: run from a checkout of the repository, never by the pipeline or the served model."""
