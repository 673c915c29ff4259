"""Exceptions users see: each names the file, row or field that is wrong and what to do."""


class UamtError(Exception):
    """Base class of errors reported to the user as one clear line (exit code 2 from the CLI)."""


class DataError(UamtError, ValueError):
    """Input data is malformed: the message names the file, row and field."""


class ChecksumError(DataError):
    """A fetched or mirrored file's sha256 differs from the pinned one."""
