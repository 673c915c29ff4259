"""What every part of uamt shares and that imports nothing heavy: params.yaml sections (:mod:`~uamt.core.config`),
the user-facing errors, atomic file writing, the score scale, text and language checks, and model naming.
"""
