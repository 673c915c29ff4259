"""New human annotations arriving in ``data/incoming/``: checked, then taken into the training pool.

* :mod:`uamt.ingest.config` -- the ``incoming`` section of params.yaml (:class:`IncomingConfig`), the
  accepted formats and columns;
* :mod:`uamt.ingest.validation` -- every problem of a file, named by file, row and field
  (:func:`validate_file`);
* :mod:`uamt.ingest.pool` -- the pool and its all-or-nothing transactions: :func:`ingest_incoming`,
  :func:`withdraw`, the pending-retrain marker and the retrain lock.

The command line is ``uamt incoming`` (:mod:`uamt.cli.incoming`); the retrain flow
(``flows/retrain.py``) runs one tick of ingestion before retraining.
"""

from uamt.ingest.config import IncomingConfig, load_config
from uamt.ingest.pool import (
    RetrainBusy,
    clear_pending,
    ingest_incoming,
    init_pool,
    new_files,
    read_pending,
    read_pool,
    retrain_lock,
    withdraw,
)
from uamt.ingest.validation import validate_file

__all__ = [
    "IncomingConfig",
    "RetrainBusy",
    "clear_pending",
    "ingest_incoming",
    "init_pool",
    "load_config",
    "new_files",
    "read_pending",
    "read_pool",
    "retrain_lock",
    "validate_file",
    "withdraw",
]
