"""Fetch the pinned public files: from an offline mirror or from their URLs, sha256-checked.

Every file is pinned in the sources file, ``data_sources.yaml`` (repository -> commit, path ->
sha256; ``params.yaml`` names it as ``fetch.sources_file`` and holds the knobs of the fetch).
A file lands at ``<raw_dir>/<repo>/<path>``, the same layout as the mirror, so loaders read
``raw_dir`` and a mirror root alike.  Files are written to a temporary file in the destination
folder and moved into place with :func:`os.replace` only after their hash matched: an
interrupted or corrupted fetch leaves no half-written file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, ConfigError, from_dict, load_section, read_params
from uamt.core.errors import ChecksumError, DataError
from uamt.core.fileio import atomic_path, sha256_file

log = logging.getLogger(__name__)

MIRROR_ENV = "UAMT_DATA_MIRROR"
DEFAULT_URL_TEMPLATE = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
DEFAULT_SOURCES_FILE = "data_sources.yaml"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class SourceFiles:
    """The files taken from one repository at one commit: ``files`` maps path -> sha256."""

    repo: str
    commit: str
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PinnedRepository:
    """One entry of the sources file (its key is the repository): the commit, path -> sha256."""

    commit: str
    files: dict[str, str]


@dataclass(frozen=True)
class FetchConfig:
    """``fetch:`` section of params.yaml, with the pins of its ``sources_file`` as ``sources``.

    mirror: folder laid out as ``<owner>/<repo>/<path>``; null = ``$UAMT_DATA_MIRROR``, and
        if that is unset too, download ``url_template`` (``{repo}``, ``{commit}``, ``{path}``).
    raw_dir: destination root.  timeout_s: per-download socket timeout.
    sources_file: the YAML file of pins (:func:`load_data_sources`); a relative path is read from
        the params file's folder, as an include (``raw_dir``, data, is relative to the working
        directory).  sources: its pins; :func:`load_fetch_config` fills them from ``sources_file``
        and refuses them in the params file (one home for the pins).
    """

    mirror: str | None = None
    url_template: str = DEFAULT_URL_TEMPLATE
    raw_dir: str = "data/raw"
    sources_file: str = DEFAULT_SOURCES_FILE
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


def load_data_sources(path: str | Path = DEFAULT_SOURCES_FILE) -> tuple[SourceFiles, ...]:
    """Read the sources file at ``path``: ``<owner>/<repo>: {commit: ..., files: {path: sha256}}``.

    Raises
    ------
    ConfigError
        The file is missing or not YAML, it pins nothing, a key is unknown or missing, a value has
        the wrong type, or a commit / sha256 is not hexadecimal of the right length; the message
        names ``<file>:<repo>.<key>``.
    """
    pinned = read_params(path, what="sources file")
    if not pinned:
        raise ConfigError(
            f"{path}: pins no file; list <owner>/<repo>: {{commit: ..., files: {{path: sha256}}}}"
        )
    sources = []
    for repo, value in pinned.items():
        where = f"{path}:{repo}"
        if not isinstance(repo, str) or not _REPO.fullmatch(repo):
            raise ConfigError(f"{where}: a key must be a GitHub repository <owner>/<name>, got {repo!r}")
        entry = from_dict(PinnedRepository, value, where=where)
        if not _COMMIT.fullmatch(entry.commit):
            raise ConfigError(f"{where}.commit: expected a 40-digit hexadecimal commit, got {entry.commit!r}")
        if not entry.files:
            raise ConfigError(f"{where}.files: empty; pin at least one path: sha256")
        for name, sha in entry.files.items():
            if not _SHA256.fullmatch(sha):
                raise ConfigError(
                    f"{where}.files.{name}: expected a sha256 (64 lowercase hex digits), got {sha!r}"
                )
        sources.append(SourceFiles(repo=repo, commit=entry.commit, files=dict(entry.files)))
    return tuple(sources)


def load_fetch_config(path: str | Path = DEFAULT_PARAMS) -> FetchConfig:
    """The ``fetch:`` section of the params file at ``path`` with the pins of its ``sources_file``.

    Raises
    ------
    ConfigError
        As :func:`uamt.core.config.load_section` and :func:`load_data_sources`; also when the params file
        lists ``fetch.sources`` itself (the pins have one home, the sources file).
    """
    section = read_params(path).get("fetch")
    if isinstance(section, dict) and "sources" in section:
        raise ConfigError(
            f"{path}:fetch.sources: the pinned files are not read from the params file; move them to "
            f"the sources file {section.get('sources_file') or DEFAULT_SOURCES_FILE} (fetch.sources_file) "
            "as <owner>/<repo>: {commit: ..., files: {path: sha256}}"
        )
    cfg = load_section(FetchConfig, "fetch", path)
    sources_file = Path(cfg.sources_file)
    if not sources_file.is_absolute():
        sources_file = Path(path).parent / sources_file
    return dataclasses.replace(cfg, sources=load_data_sources(sources_file))


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
        raise DataError(f"fetch: no pinned file to fetch; list them in {cfg.sources_file}")
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
    "PinnedRepository",
    "SourceFiles",
    "fetch_all",
    "fetch_file",
    "load_data_sources",
    "load_fetch_config",
    "resolve_mirror",
    "sha256_file",
]
