"""Re-tokenisation across two tokenizers at awkward boundaries (drafters/token_bytes.py and the
host half of drafters/cross_tokenizer.py, no model): multi-byte characters split over tokens,
spaces that merge into the next token, a draft token that splits a target token (and one that
spans two), the target's text ending inside a character, the draft's EOS. On the tiny tokenizers
(cross_pair.py) and the shipped pair's (the demo target's 4096 tokens, the cross draft's 2048)."""
import random

import pytest

from specdec_fast.drafters.cross_tokenizer import CrossTokenizerDrafter, _Row
from specdec_fast.drafters.token_bytes import TokenBytes, incomplete_tail, is_char_start, utf8_runs

from .cross_pair import tiny_tokenizers

AWKWARD = "x = 'café'  # 日本語 🐍 — “q”\n    return  é\n\n\t\tpass 12345\n"


@pytest.fixture(scope="module")
def shipped():
    from transformers import AutoTokenizer

    from specdec_fast.pair import cross_draft, tokenizer_dir

    return TokenBytes(AutoTokenizer.from_pretrained(tokenizer_dir())), TokenBytes(AutoTokenizer.from_pretrained(cross_draft()))


@pytest.fixture(scope="module")
def tiny():
    return tuple(TokenBytes(t) for t in tiny_tokenizers())


def drafter(target: TokenBytes, draft: TokenBytes) -> CrossTokenizerDrafter:
    """The drafter's host half (no runner, no state)."""
    d = CrossTokenizerDrafter(None, target, draft)
    d.max_feed, d.steps = 10**6, 1
    return d


def test_byte_tables_are_exact(shipped):
    target, draft = shipped
    assert target.kind == draft.kind == "byte_level" and target.exact
    for codec in (target, draft):
        ids = codec.encode(AWKWARD.encode())
        assert codec.bytes_of(ids) == AWKWARD.encode()
        assert codec.tokenizer.decode(ids) == AWKWARD
    assert target.table[target.eos_id] == b"" and draft.table[draft.eos_id] == b""  # special: no text
    halves = [b for b in target.table if b and (incomplete_tail(b) or b[0] & 0xC0 == 0x80)]
    assert halves, "byte-level tokens hold parts of characters"  # e.g. the first byte of a CJK character


def test_utf8_helpers():
    e = "é".encode()  # C3 A9
    assert incomplete_tail(b"ab" + e[:1]) == 1 and incomplete_tail(b"ab" + e) == 0
    assert incomplete_tail("日".encode()[:2]) == 2 and incomplete_tail(b"ab\xa9") == 0  # a lone continuation byte
    assert not is_char_start(b"a" + e, 2) and is_char_start(b"a" + e, 1) and is_char_start(b"a\xa9\xa9", 2)
    assert utf8_runs(b"ab\xa9cd") == [(0, 2, True), (2, 3, False), (3, 5, True)]


def test_encode_lone_bytes(tiny):
    """A model may emit half of a character and go on: the bytes that are no character become
    one-byte tokens, the text around them goes through the tokenizer."""
    target, _ = tiny
    ids = target.encode(b"ab\xc3 a\xa9\xa9abc")
    assert target.bytes_of(ids) == b"ab\xc3 a\xa9\xa9abc"
    assert ids == [6, 4, 7, 5, 5, 9]  # ab, 0xC3, " a", 0xA9, 0xA9, abc


@pytest.mark.parametrize("cuts", ["canonical", "random"])
def test_the_draft_context_stays_canonical(shipped, cuts):
    """Fed the target's tokens one at a time, the draft's committed + fed tokens are always its
    own tokenisation of the text so far (whole characters): the stable boundary keeps every token
    that later text could re-split tentative. 'random': the target's text cut at random character
    offsets, each piece tokenised alone (a non-canonical target stream, words split anywhere)."""
    from specdec_fast.pair import held_out_snippet

    target, draft = shipped
    text = held_out_snippet()[:1500] + AWKWARD
    if cuts == "canonical":
        ids = target.encode(text.encode())
    else:
        rng, ids, i = random.Random(0), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            ids += target.encode(text[i: i + n].encode())
            i += n
    assert target.bytes_of(ids) == text.encode()
    d = drafter(target, draft)
    row, committed = _Row(bytearray(), 0, budget=10**9), []
    for token in ids:
        row.text += target.table[token]
        keep, fed = [0], row.fed
        feed = d._refresh(row, keep, 0)
        committed += fed[: keep[0]]
        complete = bytes(row.text[: len(row.text) - incomplete_tail(row.text)])
        assert committed + feed == draft.encode(complete), complete[-40:]
    assert len(committed) > 0.8 * len(draft.encode(text.encode()))  # it did commit (not all held back)


def to_target(d, text: bytes, draft_ids, ended=False):
    return d._to_target(_Row(bytearray(text), 0), draft_ids, ended)


def test_a_draft_token_that_splits_a_target_token(tiny):
    target, draft = tiny
    d = drafter(target, draft)
    # draft a | bc | " " | ca -> "abc ca": target abc (one token the draft split), " ", c; the last
    # target token ("a": the draft may have stopped inside a longer one) is dropped
    assert to_target(d, b"ab ", [4, 6, 5, 7]) == [9, 3, 2]
    # draft a | b | ca | a -> "abcaa": the draft's "ca" spans the target's abc | a; abc, a (a cut)
    assert to_target(d, b"x", [4, 3, 7, 4]) == [9, 0]
    assert target.bytes_of([9, 3, 2]) == draft.bytes_of([4, 6, 5, 2])


def test_the_target_text_ending_inside_a_character(tiny):
    """The target emitted 0xC3 (half of é): the draft saw the text without it, must reproduce
    it, and the rest of the character goes as the target's one-byte token."""
    target, draft = tiny
    d = drafter(target, draft)
    assert to_target(d, b"ab \xc3", [0, 1, 4, 3, 5]) == [5, 6]  # é ab " " -> 0xA9, ab (" " cut)
    assert to_target(d, b"ab \xc3", [4, 3, 5]) == []  # the draft did not write 0xC3 first: no drafts


def test_spaces_merge_into_the_next_token(shipped):
    """Indentation: the target's tokens of a continuation are its own tokenisation of the text
    from the boundary (a run of spaces gives its last space to the next word), whatever the
    draft's token boundaries were."""
    target, draft = shipped
    d = drafter(target, draft)
    before, after = b"def f(x):", b"\n        return x + 1\n    y"
    ids = to_target(d, before, draft.encode(after))
    assert ids == target.encode(after)[:-1]
    assert target.bytes_of(ids) == after[: len(target.bytes_of(ids))]
    assert b" return" in [target.table[i] for i in ids]  # the space went to "return", as the target tokenises


def test_the_draft_ending_its_text(shipped):
    target, draft = shipped
    d = drafter(target, draft)
    ids = draft.encode(b"\n\nprint(x)\n")
    assert to_target(d, b"x = 1", ids, ended=True) == target.encode(b"\n\nprint(x)\n") + [target.eos_id]
    assert to_target(d, b"x = 1", ids, ended=False) == target.encode(b"\n\nprint(x)\n")[:-1]


def test_every_boundary_round_trips(shipped):
    """At every target token boundary of a text, the draft's tokens of the rest become target tokens
    that write exactly the rest's text (a prefix of it), and mostly the target's own tokens."""
    target, draft = shipped
    d = drafter(target, draft)
    data = AWKWARD.encode()
    ids = target.encode(data)
    same = 0
    for i in range(len(ids)):
        done = target.bytes_of(ids[:i])
        pending = done[len(done) - incomplete_tail(done):]
        rest = data[len(done) - len(pending):]  # the draft continues from the last whole character
        got = to_target(d, done, draft.encode(rest))
        assert data[len(done):].startswith(target.bytes_of(got)), i
        same += got == ids[i: i + len(got)]
    assert same >= 0.9 * len(ids), (same, len(ids))
