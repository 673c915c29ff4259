"""Fetch the pinned public files: from an offline mirror or from their URLs, sha256-checked.

Every file is named in ``params.yaml`` (``fetch.sources``: repository, commit, path -> sha256).
A file lands at ``<raw_dir>/<repo>/<path>``, the same layout as the mirror, so loaders read
``raw_dir`` and a mirror root alike.  Files are written to a temporary file in the destination
folder and moved into place with :func:`os.replace` only after their hash matched: an
interrupted or corrupted fetch leaves no half-written file.
"""

from __future__ import annotations

import logging
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from uamt.core.errors import ChecksumError, DataError
from uamt.core.fileio import atomic_path, sha256_file

log = logging.getLogger(__name__)

MIRROR_ENV = "UAMT_DATA_MIRROR"
DEFAULT_URL_TEMPLATE = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True)
class SourceFiles:
    """The files taken from one repository at one commit: ``files`` maps path -> sha256."""

    repo: str
    commit: str
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FetchConfig:
    """``fetch:`` section of params.yaml.

    mirror: folder laid out as ``<owner>/<repo>/<path>``; null = ``$UAMT_DATA_MIRROR``, and
        if that is unset too, download ``url_template`` (``{repo}``, ``{commit}``, ``{path}``).
    raw_dir: destination root.  timeout_s: per-download socket timeout.
    """

    mirror: str | None = None
    url_template: str = DEFAULT_URL_TEMPLATE
    raw_dir: str = "data/raw"
    sources: tuple[SourceFiles, ...] = ()
    timeout_s: float = 60.0


@dataclass(frozen=True)
class FetchReport:
    copied: tuple[str, ...] = ()
    downloaded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def n_files(self) -> int:
        return len(self.copied) + len(self.downloaded) + len(self.skipped)


def resolve_mirror(cfg: FetchConfig) -> Path | None:
    """The mirror root to copy from (``cfg.mirror``, else ``$UAMT_DATA_MIRROR``), or None to download."""
    root = cfg.mirror or os.environ.get(MIRROR_ENV) or None
    if root is None:
        return None
    path = Path(root).expanduser()
    if not path.is_dir():
        origin = "fetch.mirror" if cfg.mirror else f"${MIRROR_ENV}"
        raise DataError(f"{origin}={root}: mirror folder does not exist")
    return path


def _check_relative(path: str, what: str) -> None:
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or not parts:
        raise DataError(f"fetch: {what} {path!r} must be a relative path inside the repository")


def _check_sha256(tmp: Path, name: str, expected: str) -> None:
    actual = sha256_file(tmp)
    if actual != expected.lower():
        raise ChecksumError(f"{name}: sha256 mismatch: expected {expected.lower()}, got {actual}")


def fetch_file(
    repo: str, commit: str, path: str, sha256: str, *, raw_dir: Path, mirror: Path | None, cfg: FetchConfig
) -> str:
    """Fetch one file into ``raw_dir/repo/path``; returns ``"skipped"``, ``"copied"`` or ``"downloaded"``."""
    _check_relative(repo, "repo")
    _check_relative(path, "path")
    dest = raw_dir / repo / path
    if dest.is_file() and sha256_file(dest) == sha256.lower():
        return "skipped"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest, suffix=".part") as tmp:
        if mirror is not None:
            src = mirror / repo / path
            if not src.is_file():
                raise DataError(f"{src}: not in the mirror {mirror} (expected {repo}@{commit[:10]}:{path})")
            shutil.copyfile(src, tmp)
            _check_sha256(tmp, str(src), sha256)
            return "copied"
        url = cfg.url_template.format(repo=repo, commit=commit, path=path)
        try:
            with urllib.request.urlopen(url, timeout=cfg.timeout_s) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise DataError(
                f"{url}: download failed ({exc}); offline? set fetch.mirror or ${MIRROR_ENV} to a folder "
                "laid out as <owner>/<repo>/<path>"
            ) from exc
        _check_sha256(tmp, url, sha256)
        return "downloaded"


def fetch_all(cfg: FetchConfig) -> FetchReport:
    """Fetch every file listed in ``cfg.sources`` into ``cfg.raw_dir``.

    Raises
    ------
    ChecksumError
        A file's sha256 differs from the pinned one (message: file, expected, actual).
    DataError
        A file is missing from the mirror, or a download failed.
    """
    if not cfg.sources:
        raise DataError("fetch.sources is empty: list the repositories and files to fetch in params.yaml")
    raw_dir = Path(cfg.raw_dir)
    mirror = resolve_mirror(cfg)
    outcome: dict[str, list[str]] = {"copied": [], "downloaded": [], "skipped": []}
    for source in cfg.sources:
        for path, sha in sorted(source.files.items()):
            what = fetch_file(source.repo, source.commit, path, sha, raw_dir=raw_dir, mirror=mirror, cfg=cfg)
            outcome[what].append(f"{source.repo}/{path}")
            log.debug("%s %s/%s", what, source.repo, path)
    report = FetchReport(**{k: tuple(v) for k, v in outcome.items()})
    log.info(
        "fetch: %d files (%d copied from mirror, %d downloaded, %d already present) into %s",
        report.n_files,
        len(report.copied),
        len(report.downloaded),
        len(report.skipped),
        raw_dir,
    )
    return report


__all__ = [
    "FetchConfig",
    "FetchReport",
    "SourceFiles",
    "fetch_all",
    "fetch_file",
    "resolve_mirror",
    "sha256_file",
]
