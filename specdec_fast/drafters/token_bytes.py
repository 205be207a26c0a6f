"""TokenBytes: one tokenizer seen as bytes, for drafting across two tokenizers (cross_tokenizer.py).

Text moves between the target's and the draft's tokens as UTF-8 bytes, never through decode():
``table[id]`` is the exact bytes token ``id`` stands for, so the text of any token sequence is
the concatenation of its tokens' bytes, whatever its boundaries (a byte-level BPE token may hold
half of a multi-byte character; decode() would turn it into U+FFFD). Special tokens (BOS, EOS,
chat markers) stand for no text: b"" (transformers' decode(skip_special_tokens=True) drops them
too).

The table, by the tokenizer's decoder (its tokenizer.json):
  - ByteLevel (GPT-2, Llama 3, Qwen, the demo pair): each character of the token's string is one
    byte through GPT-2's bytes_to_unicode map;
  - SentencePiece style (a Replace of "\u2581" / ByteFallback: Llama 2, Mistral): "<0xAB>" is that
    byte, else the piece with "\u2581" as a space;
  - anything else: convert_tokens_to_string([token]) (``exact`` False: a token of part of a
    character cannot be written).
Added tokens that are not special are their own text.

encode(data) gives ids whose bytes are ``data``, or the longest prefix of an encoding that stays
inside ``data``: drafts only ever need to be plausible, never exact (the verify is), so a
tokenizer whose mid-text encoding adds text (SentencePiece's dummy-prefix space) is first retried
behind an anchor ("\\n", its tokens dropped), then cut. Bytes that are no character (a model may
emit a lone byte token) go as the tokenizer's one-byte tokens, the text around them through it.
"""
import json
from functools import lru_cache

ANCHOR = "\n"  # retry mid-text encodes behind it (SentencePiece's dummy prefix); its tokens are dropped


@lru_cache(maxsize=1)
def byte_decoder() -> dict:
    """GPT-2's bytes_to_unicode map, inverted: printable character -> byte (ByteLevel tokenizers)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), 256))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _char_len(lead: int) -> int:
    """Bytes of the UTF-8 character a lead byte opens (1 for ASCII and for a byte no character opens)."""
    return 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1


def incomplete_tail(data) -> int:
    """Bytes at the end of ``data`` that start a UTF-8 character not finished yet (0 to 3)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): how long is its character?
            return back if _char_len(byte) > back else 0
    return 0


def is_char_start(data, i: int) -> bool:
    """Whether byte offset i of ``data`` is not inside a well-formed multi-byte character (a lone
    continuation byte, which a model may emit, is its own boundary)."""
    for back in range(1, 4):
        j = i - back
        if j < 0:
            return True
        byte = data[j]
        if byte & 0xC0 != 0x80:
            need = _char_len(byte)
            return need <= back or not all(b & 0xC0 == 0x80 for b in data[j + 1: j + need])
    return True


def utf8_runs(data: bytes) -> list:
    """``data`` as (start, end, valid) runs: valid UTF-8 text, or bytes that are no character (a lone
    continuation byte, a lead byte without its continuation: a model may emit those)."""
    out, at = [], 0
    while at < len(data):
        try:
            data[at:].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start:
                out.append((at, at + exc.start, True))
            out.append((at + exc.start, at + exc.end, False))
            at += exc.end
        else:
            out.append((at, len(data), True))
            break
    return out


def _decoder_kinds(tokenizer) -> set:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    try:
        spec = json.loads(backend.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return set()
    kinds, stack = set(), [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kinds.add(node.get("type"))
            if node.get("type") == "Replace" and "\u2581" in json.dumps(node.get("pattern")):
                kinds.add("Metaspace")
            stack.extend(node.get("decoders") or [])
    return kinds


class TokenBytes:
    """``tokenizer`` as bytes: table (list of bytes, one per id), special (ids of no text),
    encode(bytes) -> ids, bytes_of(ids) -> bytes, single_byte {byte: id} (tokens of one raw byte),
    prefix_ids (what the tokenizer puts before a text: BOS), eos_id, exact (the table is exact)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        vocab = tokenizer.get_vocab()
        size = max(len(tokenizer), max(vocab.values()) + 1)
        self.special = frozenset(int(i) for i in tokenizer.all_special_ids)
        added = {int(i): t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        kinds = _decoder_kinds(tokenizer)
        if hasattr(tokenizer, "byte_decoder"):  # a slow (Python) byte-level BPE tokenizer
            kinds.add("ByteLevel")
        if hasattr(tokenizer, "sp_model"):  # a slow SentencePiece tokenizer
            kinds.add("Metaspace")
        self.kind = "byte_level" if "ByteLevel" in kinds else "sentencepiece" if kinds & {"Metaspace", "ByteFallback"} else "text"
        self.exact = self.kind != "text"
        table = [b""] * size
        for token, i in vocab.items():
            if i in self.special or getattr(added.get(i), "special", False):
                continue
            table[i] = added[i].content.encode("utf-8") if i in added else self._token_bytes(token)
        self.table = table
        self.single_byte = {}
        for i, b in enumerate(table):
            if len(b) == 1 and b[0] not in self.single_byte:
                self.single_byte[b[0]] = i
        self.eos_id = tokenizer.eos_token_id
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        cut = next((i for i in range(len(with_special)) if with_special[i:i + len(plain)] == plain), 0)
        self.prefix_ids = [int(i) for i in with_special[:cut]]
        self.max_token_bytes = max(len(b) for b in table)

    def _token_bytes(self, token: str) -> bytes:
        if self.kind == "byte_level":
            decode = byte_decoder()
            return bytes(decode[c] for c in token) if all(c in decode for c in token) else token.encode("utf-8")
        if self.kind == "sentencepiece":
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                try:
                    return bytes([int(token[3:5], 16)])
                except ValueError:
                    pass
            return token.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.convert_tokens_to_string([token]).encode("utf-8")

    def stable_bytes(self, data: bytes) -> int | None:
        """How many bytes at the start of the text ``data`` (whole characters) keep their tokens
        whatever text follows: up to the start of its second-to-last pre-token (BPE never merges
        across pre-tokens, and appended text re-splits at most the last two: a word that grows, a
        whitespace run that gives its last space to the next word). None without a pre-tokenizer
        (or with a normaliser, which moves offsets)."""
        pre = None if self.backend is None or self.backend.normalizer is not None else self.backend.pre_tokenizer
        if pre is None:
            return None
        start = max([end for _, end, valid in utf8_runs(data) if not valid] or [0])  # encode() cuts there
        text = data[start:].decode("utf-8")
        pieces = pre.pre_tokenize_str(text)
        return start + (0 if len(pieces) < 2 else len(text[: pieces[-2][1][0]].encode("utf-8")))

    def bytes_of(self, ids) -> bytes:
        table = self.table
        return b"".join(table[i] for i in ids if 0 <= i < len(table))

    def _encode_text(self, text: str) -> list:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids  # 4x faster than tokenizer(...)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, data: bytes) -> list:
        """Token ids of the text ``data`` (UTF-8 bytes), encoded from a token boundary: their bytes
        are ``data`` (or a prefix of it, see the module docstring)."""
        ids = []
        for start, end, valid in utf8_runs(data):
            piece = data[start:end]
            got = self._encode_run(piece) if valid else [self.single_byte.get(b) for b in piece]
            if None in got:
                return ids + got[: got.index(None)]
            ids += got
            if valid and self.bytes_of(got) != piece:
                return ids
        return ids

    def _encode_run(self, data: bytes) -> list:
        """encode() of valid UTF-8 text."""
        ids = self._encode_text(data.decode("utf-8"))
        if self.bytes_of(ids) == data:
            return ids
        anchored = self._encode_text(ANCHOR + data.decode("utf-8"))
        done, anchor = 0, ANCHOR.encode()
        for i, token in enumerate(anchored):
            done += len(self.table[token]) if 0 <= token < len(self.table) else 0
            if done >= len(anchor):
                head = self.bytes_of(anchored[: i + 1])
                if head in (anchor, b" " + anchor) and self.bytes_of(anchored[i + 1:]) == data:
                    return anchored[i + 1:]
                break
        return self.prefix_within(ids, data)

    def prefix_within(self, ids, data: bytes) -> list:
        """The longest prefix of ``ids`` whose bytes are a prefix of ``data``."""
        out, at = [], 0
        for token in ids:
            piece = self.table[token] if 0 <= token < len(self.table) else b""
            if not piece or data[at: at + len(piece)] != piece:
                break
            out.append(token)
            at += len(piece)
        return out
