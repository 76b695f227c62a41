"""Tokenizer and vocabulary of a Hugging Face checkpoint, made to agree with llama.cpp.

The ``tokenizers`` library (``tokenizer.json``) does the work. Two things differ from
calling it plainly: ``special=False`` tokenizes control-token text as ordinary text (the
tokenizer's added-token matching is bypassed for special tokens), and the vocabulary is
read back as raw bytes (byte-level BPE pieces are mapped through the GPT-2 byte alphabet,
SentencePiece pieces through ``▁`` and ``<0xNN>``), with the same special and
end-of-generation tokens llama.cpp reports for the GGUF of the same model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .base import Vocabulary

# Token texts llama.cpp treats as end of generation (llama-vocab.cpp: end of turn, end of
# message, and the FIM repo/separator/pad tokens).
EOG_TEXTS: frozenset[str] = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<｜end▁of▁sentence｜>",
        "<|fim_pad|>",
        "<fim-pad>",
        "<PAD>",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    }
)

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def gpt2_unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode``: printable stand-in character -> byte."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class HFTokenizer:
    """``tokenizer.json`` of a checkpoint folder, tokenizing as llama.cpp does."""

    def __init__(self, folder: Path, n_vocab: int) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - tokenizers comes with transformers
            raise ModelLoadError("The Transformers backend needs the `tokenizers` package.") from exc
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{folder} has no tokenizer.json; the Transformers backend needs a fast (tokenizers) tokenizer."
            )
        try:
            self._tok = Tokenizer.from_file(str(path))
            spec = json.loads(path.read_text(encoding="utf-8"))
        except Exception as exc:
            raise ModelLoadError(f"{path} is not a readable tokenizer: {exc}") from exc
        self._config = _read_json(folder / "tokenizer_config.json")
        decoder = spec.get("decoder") or {}
        pre = spec.get("pre_tokenizer") or {}
        self.byte_level = "ByteLevel" in json.dumps(decoder) or "ByteLevel" in json.dumps(pre)
        added = self._tok.get_added_tokens_decoder()
        self._added: dict[int, Any] = dict(added)
        # Non-special added tokens are split off even with special=False, as llama.cpp does
        # for its USER_DEFINED tokens.
        self._plain_added = sorted(
            (t.content for t in added.values() if not t.special and t.content), key=len, reverse=True
        )
        self.n_vocab = max(n_vocab, self._tok.get_vocab_size(with_added_tokens=True))

    # -- special tokens ------------------------------------------------------------------

    def special_text(self, key: str) -> str | None:
        """The text of a named special token in ``tokenizer_config.json`` (``eos_token``, ...)."""
        value = self._config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) and value else None

    def token_id(self, text: str | None) -> int | None:
        if text is None:
            return None
        tok = self._tok.token_to_id(text)
        return int(tok) if tok is not None else None

    # -- vocabulary ----------------------------------------------------------------------

    def vocabulary(self, eos_candidates: Iterable[int]) -> Vocabulary:
        """Every token's bytes, the special tokens, and the end-of-generation tokens.

        ``eos_candidates`` are ids from the model's configs; the first one found is the
        primary EOS (as in llama.cpp: EOS first, then the other EOG tokens by id).
        """
        to_byte = gpt2_unicode_to_byte()
        pieces: list[bytes] = []
        special: set[int] = set()
        for i in range(self.n_vocab):
            tok = self._added.get(i)
            if tok is not None:
                pieces.append(tok.content.encode("utf-8"))
                content = tok.content
                if tok.special or (content.startswith("<") and content.endswith(">")):
                    special.add(i)
                continue
            text = self._tok.id_to_token(i)
            if text is None:  # padding rows beyond the tokenizer: llama.cpp's convention
                pieces.append(f"[PAD{i}]".encode())
                continue
            pieces.append(self._piece_bytes(text, to_byte))
        eog = {i for i in special if pieces[i].decode("utf-8", "replace") in EOG_TEXTS}
        candidates = [i for i in eos_candidates if 0 <= i < self.n_vocab]
        eos = candidates[0] if candidates else None
        eog |= set(candidates)
        eos_ids = ([eos] if eos is not None else []) + sorted(t for t in eog if t != eos)
        bos = self.token_id(self.special_text("bos_token"))
        add_bos = False
        if bos is not None:
            with_special = self._tok.encode("a", add_special_tokens=True).ids
            add_bos = bool(with_special) and with_special[0] == bos
        return Vocabulary(
            token_bytes=tuple(pieces),
            special_ids=frozenset(special),
            eos_ids=tuple(eos_ids),
            bos_id=bos,
            add_bos=add_bos,
        )

    def _piece_bytes(self, text: str, to_byte: dict[str, int]) -> bytes:
        if self.byte_level:
            try:
                return bytes(to_byte[c] for c in text)
            except KeyError:
                return text.encode("utf-8")
        m = _BYTE_TOKEN.match(text)
        if m:
            return bytes([int(m.group(1), 16)])
        return text.replace("▁", " ").encode("utf-8")

    # -- tokenization --------------------------------------------------------------------

    def encode(self, data: bytes, *, special: bool) -> list[int]:
        """Token ids of ``data``; no BOS. Each byte of invalid UTF-8 reads as U+FFFD, as in llama.cpp."""
        parts: list[str] = []
        while data:
            try:
                parts.append(data.decode("utf-8"))
                break
            except UnicodeDecodeError as exc:
                parts.append(data[: exc.start].decode("utf-8"))
                parts.append("\ufffd" * (exc.end - exc.start))
                data = data[exc.end :]
        text = "".join(parts)
        return self._encode_text(text, special) if text else []

    def _encode_text(self, text: str, special: bool) -> list[int]:
        if special:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        for part, is_added in _split_on(text, self._plain_added):
            if is_added:
                tok = self._tok.token_to_id(part)
                assert tok is not None
                out.append(int(tok))
            elif part:
                out.extend(self._encode_plain(part))
        return out

    def _encode_plain(self, text: str) -> list[int]:
        """The tokenizer's pipeline without added-token matching (normaliser, pre-tokeniser, model)."""
        tok = self._tok
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)] if tok.pre_tokenizer is not None else [text]
        return [t.id for piece in pieces for t in tok.model.tokenize(piece)]


def _split_on(text: str, needles: list[str]) -> list[tuple[str, bool]]:
    """Split ``text`` around occurrences of ``needles`` (longest first at each position)."""
    if not needles or not any(n in text for n in needles):
        return [(text, False)]
    parts: list[tuple[str, bool]] = []
    i = start = 0
    while i < len(text):
        for n in needles:
            if text.startswith(n, i):
                parts.append((text[start:i], False))
                parts.append((n, True))
                i += len(n)
                start = i
                break
        else:
            i += 1
    parts.append((text[start:], False))
    return parts


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
