"""New annotations arriving in ``data/incoming/``: the pool, its validation and merging into the
prepared data (read by the retrain flow and ``uamt incoming``).
"""
