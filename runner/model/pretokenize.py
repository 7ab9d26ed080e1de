r"""Pre-tokenizers of byte-level BPE vocabularies: llama.cpp's regex lists, run the way it runs them.

``tokenizer.ggml.pre`` names a pre-tokenizer. llama.cpp (``llama_vocab::impl::load``) maps the
name to a type and a few flags, and ``llm_tokenizer_bpe`` maps the type to a list of regexes:
:data:`PRE_TYPES` and :data:`PRE_REGEXES` here, the one table of that rule. Each regex in turn
splits every piece the previous ones left, and llama.cpp runs a regex one of three ways
(``unicode_regex_split``), so we do too:

* **hand-written** -- GPT-2's, Llama 3's, Qwen2's and Qwen3.5's regexes, a newline splitter, a
  digit grouper and Kimi-K2's splitter have their own code there, with full Unicode classes. We
  run the same regex with the ``regex`` package's Unicode classes (Kimi-K2's as the regex its code
  implements, the digit grouper as the same rule in Python). Their pieces tile the text.
* **collapsed** -- a regex with Unicode classes (``\p{L}``, ``\p{N}``, ``\p{P}``, ``\p{M}``,
  ``\p{S}``, ``\p{Lu}``, ...) goes through ``std::regex`` on a collapsed text: ASCII stays, any
  other character becomes one byte for its class (whitespace becomes ``\v``), and ``\p{X}``
  becomes "that byte or X's ASCII members" -- so ``\p{Lu}`` is any letter and ``[^a-z]`` holds
  every non-ASCII letter. We collapse the same way and run the same regex with ASCII classes.
* **wide** -- any other regex goes through ``std::wregex`` on the text with non-ASCII whitespace
  turned into ``\v``, with ASCII ``\s``/``\d``/``\w``: the same here.

For the last two, the text between two matches is a piece of its own (``unicode_regex_split_stl``),
empty matches only cut, and ``$`` is the end of the piece (ECMAScript, not Python's "or before a
final newline"). Character classes follow llama.cpp's Unicode 15.1 tables: a code point assigned
in a later Unicode version (which the ``regex`` package may know) counts as unassigned there.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import regex

__all__ = ["PRE_REGEXES", "PRE_TYPES", "PreTokenizer", "PreType"]

# --------------------------------------------------------------------- Unicode 15.1 tables
# Code points that llama.cpp's unicode tables (src/unicode-data.cpp, Unicode 15.1) leave
# unassigned ("undefined": neither letter nor number nor whitespace). The ``regex`` package may
# follow a newer Unicode and call some of them letters; such characters are replaced by an
# always-unassigned stand-in (U+FDD0) before the regexes see the text.
_UNASSIGNED_15_1 = """
    378-379 380-383 38B 38D 3A2 530 557-558 58B-58C 590 5C8-5CF 5EB-5EE 5F5-5FF 70E 74B-74C 7B2-7BF
    7FB-7FC 82E-82F 83F 85C-85D 85F 86B-86F 88F 892-897 984 98D-98E 991-992 9A9 9B1 9B3-9B5 9BA-9BB
    9C5-9C6 9C9-9CA 9CF-9D6 9D8-9DB 9DE 9E4-9E5 9FF-A00 A04 A0B-A0E A11-A12 A29 A31 A34 A37 A3A-A3B
    A3D A43-A46 A49-A4A A4E-A50 A52-A58 A5D A5F-A65 A77-A80 A84 A8E A92 AA9 AB1 AB4 ABA-ABB AC6 ACA
    ACE-ACF AD1-ADF AE4-AE5 AF2-AF8 B00 B04 B0D-B0E B11-B12 B29 B31 B34 B3A-B3B B45-B46 B49-B4A
    B4E-B54 B58-B5B B5E B64-B65 B78-B81 B84 B8B-B8D B91 B96-B98 B9B B9D BA0-BA2 BA5-BA7 BAB-BAD
    BBA-BBD BC3-BC5 BC9 BCE-BCF BD1-BD6 BD8-BE5 BFB-BFF C0D C11 C29 C3A-C3B C45 C49 C4E-C54 C57 C5B-C5C
    C5E-C5F C64-C65 C70-C76 C8D C91 CA9 CB4 CBA-CBB CC5 CC9 CCE-CD4 CD7-CDC CDF CE4-CE5 CF0 CF4-CFF D0D
    D11 D45 D49 D50-D53 D64-D65 D80 D84 D97-D99 DB2 DBC DBE-DBF DC7-DC9 DCB-DCE DD5 DD7 DE0-DE5
    DF0-DF1 DF5-E00 E3B-E3E E5C-E80 E83 E85 E8B EA4 EA6 EBE-EBF EC5 EC7 ECF EDA-EDB EE0-EFF F48
    F6D-F70 F98 FBD FCD FDB-FFF 10C6 10C8-10CC 10CE-10CF 1249 124E-124F 1257 1259 125E-125F 1289
    128E-128F 12B1 12B6-12B7 12BF 12C1 12C6-12C7 12D7 1311 1316-1317 135B-135C 137D-137F 139A-139F
    13F6-13F7 13FE-13FF 169D-169F 16F9-16FF 1716-171E 1737-173F 1754-175F 176D 1771 1774-177F
    17DE-17DF 17EA-17EF 17FA-17FF 181A-181F 1879-187F 18AB-18AF 18F6-18FF 191F 192C-192F 193C-193F
    1941-1943 196E-196F 1975-197F 19AC-19AF 19CA-19CF 19DB-19DD 1A1C-1A1D 1A5F 1A7D-1A7E 1A8A-1A8F
    1A9A-1A9F 1AAE-1AAF 1ACF-1AFF 1B4D-1B4F 1B7F 1BF4-1BFB 1C38-1C3A 1C4A-1C4C 1C89-1C8F 1CBB-1CBC
    1CC8-1CCF 1CFB-1CFF 1F16-1F17 1F1E-1F1F 1F46-1F47 1F4E-1F4F 1F58 1F5A 1F5C 1F5E 1F7E-1F7F 1FB5
    1FC5 1FD4-1FD5 1FDC 1FF0-1FF1 1FF5 1FFF 2065 2072-2073 208F 209D-209F 20C1-20CF 20F1-20FF
    218C-218F 2427-243F 244B-245F 2B74-2B75 2B96 2CF4-2CF8 2D26 2D28-2D2C 2D2E-2D2F 2D68-2D6E
    2D71-2D7E 2D97-2D9F 2DA7 2DAF 2DB7 2DBF 2DC7 2DCF 2DD7 2DDF 2E5E-2E7F 2E9A 2EF4-2EFF 2FD6-2FEF
    3040 3097-3098 3100-3104 3130 318F 31E4-31EE 321F A48D-A48F A4C7-A4CF A62C-A63F A6F8-A6FF A7CB-A7CF
    A7D2 A7D4 A7DA-A7F1 A82D-A82F A83A-A83F A878-A87F A8C6-A8CD A8DA-A8DF A954-A95E A97D-A97F A9CE
    A9DA-A9DD A9FF AA37-AA3F AA4E-AA4F AA5A-AA5B AAC3-AADA AAF7-AB00 AB07-AB08 AB0F-AB10 AB17-AB1F
    AB27 AB2F AB6C-AB6F ABEE-ABEF ABFA-ABFF D7A4-D7AF D7C7-D7CA D7FC-D7FF FA6E-FA6F FADA-FAFF FB07-FB12
    FB18-FB1C FB37 FB3D FB3F FB42 FB45 FBC3-FBD2 FD90-FD91 FDC8-FDCE FDD0-FDEF FE1A-FE1F FE53 FE67
    FE6C-FE6F FE75 FEFD-FEFE FF00 FFBF-FFC1 FFC8-FFC9 FFD0-FFD1 FFD8-FFD9 FFDD-FFDF FFE7 FFEF-FFF8
    FFFE-FFFF 1000C 10027 1003B 1003E 1004E-1004F 1005E-1007F 100FB-100FF 10103-10106 10134-10136
    1018F 1019D-1019F 101A1-101CF 101FE-1027F 1029D-1029F 102D1-102DF 102FC-102FF 10324-1032C
    1034B-1034F 1037B-1037F 1039E 103C4-103C7 103D6-103FF 1049E-1049F 104AA-104AF 104D4-104D7
    104FC-104FF 10528-1052F 10564-1056E 1057B 1058B 10593 10596 105A2 105B2 105BA 105BD-105FF
    10737-1073F 10756-1075F 10768-1077F 10786 107B1 107BB-107FF 10806-10807 10809 10836 10839-1083B
    1083D-1083E 10856 1089F-108A6 108B0-108DF 108F3 108F6-108FA 1091C-1091E 1093A-1093E 10940-1097F
    109B8-109BB 109D0-109D1 10A04 10A07-10A0B 10A14 10A18 10A36-10A37 10A3B-10A3E 10A49-10A4F
    10A59-10A5F 10AA0-10ABF 10AE7-10AEA 10AF7-10AFF 10B36-10B38 10B56-10B57 10B73-10B77 10B92-10B98
    10B9D-10BA8 10BB0-10BFF 10C49-10C7F 10CB3-10CBF 10CF3-10CF9 10D28-10D2F 10D3A-10E5F 10E7F 10EAA
    10EAE-10EAF 10EB2-10EFC 10F28-10F2F 10F5A-10F6F 10F8A-10FAF 10FCC-10FDF 10FF7-10FFF 1104E-11051
    11076-1107E 110C3-110CC 110CE-110CF 110E9-110EF 110FA-110FF 11135 11148-1114F 11177-1117F
    111E0 111F5-111FF 11212 11242-1127F 11287 11289 1128E 1129E 112AA-112AF 112EB-112EF 112FA-112FF
    11304 1130D-1130E 11311-11312 11329 11331 11334 1133A 11345-11346 11349-1134A 1134E-1134F
    11351-11356 11358-1135C 11364-11365 1136D-1136F 11375-113FF 1145C 11462-1147F 114C8-114CF
    114DA-1157F 115B6-115B7 115DE-115FF 11645-1164F 1165A-1165F 1166D-1167F 116BA-116BF 116CA-116FF
    1171B-1171C 1172C-1172F 11747-117FF 1183C-1189F 118F3-118FE 11907-11908 1190A-1190B 11914
    11917 11936 11939-1193A 11947-1194F 1195A-1199F 119A8-119A9 119D8-119D9 119E5-119FF 11A48-11A4F
    11AA3-11AAF 11AF9-11AFF 11B0A-11BFF 11C09 11C37 11C46-11C4F 11C6D-11C6F 11C90-11C91 11CA8
    11CB7-11CFF 11D07 11D0A 11D37-11D39 11D3B 11D3E 11D48-11D4F 11D5A-11D5F 11D66 11D69 11D8F
    11D92 11D99-11D9F 11DAA-11EDF 11EF9-11EFF 11F11 11F3B-11F3D 11F5A-11FAF 11FB1-11FBF 11FF2-11FFE
    1239A-123FF 1246F 12475-1247F 12544-12F8F 12FF3-12FFF 13456-143FF 14647-167FF 16A39-16A3F 16A5F
    16A6A-16A6D 16ABF 16ACA-16ACF 16AEE-16AEF 16AF6-16AFF 16B46-16B4F 16B5A 16B62 16B78-16B7C
    16B90-16E3F 16E9B-16EFF 16F4B-16F4E 16F88-16F8E 16FA0-16FDF 16FE5-16FEF 16FF2-16FFF 187F8-187FF
    18CD6-18CFF 18D09-1AFEF 1AFF4 1AFFC 1AFFF 1B123-1B131 1B133-1B14F 1B153-1B154 1B156-1B163
    1B168-1B16F 1B2FC-1BBFF 1BC6B-1BC6F 1BC7D-1BC7F 1BC89-1BC8F 1BC9A-1BC9B 1BCA4-1CEFF 1CF2E-1CF2F
    1CF47-1CF4F 1CFC4-1CFFF 1D0F6-1D0FF 1D127-1D128 1D1EB-1D1FF 1D246-1D2BF 1D2D4-1D2DF 1D2F4-1D2FF
    1D357-1D35F 1D379-1D3FF 1D455 1D49D 1D4A0-1D4A1 1D4A3-1D4A4 1D4A7-1D4A8 1D4AD 1D4BA 1D4BC 1D4C4
    1D506 1D50B-1D50C 1D515 1D51D 1D53A 1D53F 1D545 1D547-1D549 1D551 1D6A6-1D6A7 1D7CC-1D7CD
    1DA8C-1DA9A 1DAA0 1DAB0-1DEFF 1DF1F-1DF24 1DF2B-1DFFF 1E007 1E019-1E01A 1E022 1E025 1E02B-1E02F
    1E06E-1E08E 1E090-1E0FF 1E12D-1E12F 1E13E-1E13F 1E14A-1E14D 1E150-1E28F 1E2AF-1E2BF 1E2FA-1E2FE
    1E300-1E4CF 1E4FA-1E7DF 1E7E7 1E7EC 1E7EF 1E7FF 1E8C5-1E8C6 1E8D7-1E8FF 1E94C-1E94F 1E95A-1E95D
    1E960-1EC70 1ECB5-1ED00 1ED3E-1EDFF 1EE04 1EE20 1EE23 1EE25-1EE26 1EE28 1EE33 1EE38 1EE3A
    1EE3C-1EE41 1EE43-1EE46 1EE48 1EE4A 1EE4C 1EE50 1EE53 1EE55-1EE56 1EE58 1EE5A 1EE5C 1EE5E 1EE60
    1EE63 1EE65-1EE66 1EE6B 1EE73 1EE78 1EE7D 1EE7F 1EE8A 1EE9C-1EEA0 1EEA4 1EEAA 1EEBC-1EEEF
    1EEF2-1EFFF 1F02C-1F02F 1F094-1F09F 1F0AF-1F0B0 1F0C0 1F0D0 1F0F6-1F0FF 1F1AE-1F1E5 1F203-1F20F
    1F23C-1F23F 1F249-1F24F 1F252-1F25F 1F266-1F2FF 1F6D8-1F6DB 1F6ED-1F6EF 1F6FD-1F6FF 1F777-1F77A
    1F7DA-1F7DF 1F7EC-1F7EF 1F7F1-1F7FF 1F80C-1F80F 1F848-1F84F 1F85A-1F85F 1F888-1F88F 1F8AE-1F8AF
    1F8B2-1F8FF 1FA54-1FA5F 1FA6E-1FA6F 1FA7D-1FA7F 1FA89-1FA8F 1FABE 1FAC6-1FACD 1FADC-1FADF
    1FAE9-1FAEF 1FAF9-1FAFF 1FB93 1FBCB-1FBEF 1FBFA-1FFFF 2A6E0-2A6FF 2B73A-2B73F 2B81E-2B81F
    2CEA2-2CEAF 2EBE1-2EBEF 2EE5E-2F7FF 2FA1E-2FFFF 3134B-3134F 323B0-E0000 E0002-E001F E0080-E00FF
    E01F0-EFFFF FFFFE-FFFFF 10FFFE-10FFFF
"""
_UNASSIGNED_STAND_IN = "\ufdd0"  # a noncharacter: unassigned in every Unicode version
_FIRST_UNASSIGNED = "\u0378"  # everything below is assigned


@functools.lru_cache(maxsize=1)
def _unassigned_ranges() -> tuple[list[int], list[int]]:
    """(starts, ends) of _UNASSIGNED_15_1, sorted, inclusive."""
    starts: list[int] = []
    ends: list[int] = []
    for item in _UNASSIGNED_15_1.split():
        lo, _, hi = item.partition("-")
        starts.append(int(lo, 16))
        ends.append(int(hi or lo, 16))
    return starts, ends


_CN = regex.compile(r"\p{Cn}")


@functools.lru_cache(maxsize=8192)
def _newly_assigned(char: str) -> bool:
    """True for a character the ``regex`` package knows but llama.cpp's Unicode 15.1 does not."""
    starts, ends = _unassigned_ranges()
    i = bisect.bisect_right(starts, ord(char)) - 1
    return i >= 0 and ord(char) <= ends[i] and _CN.match(char) is None


def _as_unicode_15_1(text: str) -> str:
    """``text`` with characters unassigned in Unicode 15.1 replaced by U+FDD0 (same length).

    Returns ``text`` itself (the same object) when nothing needs replacing, which is the rule.
    """
    if text.isascii():
        return text
    odd = [c for c in set(text) if c >= _FIRST_UNASSIGNED and _newly_assigned(c)]
    if not odd:
        return text
    return text.translate(dict.fromkeys(map(ord, odd), _UNASSIGNED_STAND_IN))


# ------------------------------------------------------------------------- the regexes (verbatim)
# Each regex as llama.cpp's llm_tokenizer_bpe writes it, as a raw string ("\\p" there is r"\p"
# here, and a real "\r" there is r"\r" here: the same regex).
_C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"  # contractions, both cases
_TAIL = r"\s*[\r\n]+|\s+(?!\S)|\s+"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL
QWEN2 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL
QWEN35 = _C + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|" + _TAIL
NEWLINES = r"[^\n]+|[\n]+"
KIMI_K2 = r"\p{Han}+"  # stands for a whole hand-written splitter there
AFMOE_DIGITS = r"\p{AFMoE_digits}"
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"
_PUNCT_WORD = r'''[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+'''
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{c}"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{c}")
_CASED_PROPS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+{c}"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*{c}")
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CJK_KANA = r"[一-龥぀-ゟ゠-ヿ]+"
_CJK_HANGUL = r"[一-龥ࠀ-一가-퟿]+"

PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),  # also dbrx, smaug and chatglm4: the same string
    "jais2": (_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
              r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "deepseek-llm": (
        r"[\r\n]",
        # letters of the scripts that have case, as code points (their look-alikes normalize away)
        r"\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
        r"\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
        r"\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
        r"\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
        r"\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
        r"\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC"
        r"\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
        r"\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
        r"\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
        r"\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
        r"\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
        r"\U0001E900-\U0001E943]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", _CJK_HANGUL, r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"),
    "deepseek3": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*|" + _TAIL),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": (r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
              _CASED_PROPS.replace("{c}", _C + "?") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", GPT2),
    "gpt2": (GPT2,),
    "qwen2": (QWEN2,),  # also hunyuan, grok-2 and solar-open: the same string
    "qwen35": (QWEN35,),
    "poro": (_PORO,),
    "viking": (_PORO, r"\p{N}"),
    "tekken": (_CASED.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL,),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": (_CASED.replace("{c}", _C + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL,),
    "granite-emb-multi": (_CASED.replace("{c}", _C + "?").replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
                          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL,),
    "tiny-aya": (TINY_AYA_DIGITS,
                 _CASED_PROPS.replace("{c}", _C + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _TAIL),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|" + _TAIL,),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL,),
    # llama.cpp's source has U+8C48 where U+F900 was meant (a normalization ate it): so here too.
    "afmoe": (AFMOE_DIGITS, r"[\u4E00-\u9FFF\u3400-\u4DBF\u8C48-\uFAFF\u3040-\u309F\u30A0-\u30FF"
              r"\uFF65-\uFF9F\u2F00-\u2FDF\u0E40-\u0E7F\u0E80-\u0EFF\u1780-\u17FF\u1000-\u109F\uAA60-\uAA7F"
              r"\uA9E0-\uA9FF\uAC00-\uD7AF\u1100-\u11FF]+",
              _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*|" + _TAIL),
    "laguna": (NEWLINES, QWEN2),
    "exaone-moe": (_C + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "kimi-k2": (KIMI_K2,),
    "minicpm5": (r"\p{N}{1,3}", _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _TAIL),
}


@dataclass(frozen=True)
class PreType:
    """What a ``tokenizer.ggml.pre`` name means to llama.cpp (llama_vocab::impl::load)."""

    regexes: str  # key of PRE_REGEXES
    ignore_merges: bool = False  # a word that is a whole token is emitted as is
    add_bos: bool = False  # default of add_bos when the GGUF does not say
    no_bos: bool = False  # the default BOS id is "none"


def _pre_types() -> dict[str, PreType]:
    table: dict[str, PreType] = {"": PreType("default"), "default": PreType("default")}
    groups: list[tuple[tuple[str, ...], PreType]] = [
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano"), PreType("llama3", ignore_merges=True, add_bos=True)),
        (("dbrx", "smaug-bpe"), PreType("llama3")),
        (("chatglm-bpe",), PreType("llama3", no_bos=True)),
        (("glm4", "glm5"), PreType("llama3", ignore_merges=True, no_bos=True)),
        (("jais-2",), PreType("jais2")),
        (("deepseek-llm",), PreType("deepseek-llm")),
        (("deepseek-coder",), PreType("deepseek-coder")),
        (("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), PreType("deepseek3")),
        (("spark2_5",), PreType("spark2_5")),
        (("youtu",), PreType("youtu", ignore_merges=True)),
        (("falcon",), PreType("falcon")),
        (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
          "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
          "exaone4", "trillion", "granite-docling"), PreType("gpt2")),
        (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
          "mellum2"), PreType("starcoder")),
        (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
          "solar-open", "grok-2"), PreType("qwen2")),
        (("qwen35",), PreType("qwen35")),
        (("poro-chat", "bloom", "gpt3-finnish"), PreType("poro")),
        (("viking",), PreType("viking")),
        (("tekken",), PreType("tekken", ignore_merges=True, add_bos=True)),
        (("chameleon",), PreType("chameleon", add_bos=True)),
        (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreType("gpt4o")),
        (("granite-embed-multi-97m",), PreType("granite-emb-multi", ignore_merges=True)),
        (("tiny_aya", "cohere2moe"), PreType("tiny-aya")),
        (("superbpe",), PreType("superbpe")),
        (("bailingmoe", "bailingmoe2", "llada-moe"), PreType("bailingmoe")),
        (("seed-coder",), PreType("seed-coder")),
        (("ufakzeka",), PreType("ufakzeka")),
        (("afmoe",), PreType("afmoe")),
        (("laguna",), PreType("laguna")),
        (("exaone-moe",), PreType("exaone-moe")),
        (("minicpm5",), PreType("minicpm5", ignore_merges=True)),
        (("kimi-k2",), PreType("kimi-k2")),
    ]
    for names, pre in groups:
        table.update(dict.fromkeys(names, pre))
    return table


# ``tokenizer.ggml.pre`` name -> its meaning. A name missing here is one llama.cpp does not know,
# or one it does not run as regexes + byte-level BPE (gemma4, sarvam-moe and granite-embed-multi-311m
# merge raw UTF-8 with SPM-style spaces; whitespace splits on whitespace only): the tokenizer
# refuses those.
PRE_TYPES = _pre_types()


# --------------------------------------------------------------------- hand-written splitters
# llama.cpp's unicode_regex_split_custom: regex -> the regex that does the same with Unicode
# classes in Python. GPT-2's splitter also takes whitespace the regex leaves (hence "|\s+").
_GPT2_TILING = GPT2 + r"|\s+"
# StarCoder's pair, \p{N} then GPT-2 on the gaps, as one regex: each digit alone, GPT-2 without
# its digit alternative between them, and a digit ends a run of spaces as the end of a gap does,
# hence (?![^\s\p{N}]) for (?!\S). One pass instead of a regex call per gap (they are many in
# numbers, tables and base64).
_STARCODER = r"\p{N}|" + _GPT2_TILING.replace(r" ?\p{N}+|", "").replace(r"\s+(?!\S)", r"\s+(?![^\s\p{N}])")
_FUSED: dict[tuple[str, str], str] = {(r"\p{N}", GPT2): _STARCODER}
# Kimi-K2's splitter as one regex: Han runs; words of other letters (marks are not letters there)
# after an optional non-letter, with a contraction; up to three digits; anything else but
# whitespace, with trailing newlines; whitespace as in Llama 3.
_HAN = (r"\u4E00-\u9FFF\u3400-\u4DBF\U00020000-\U0002A6DF\U0002A700-\U0002B73F\U0002B740-\U0002B81F"
        r"\U0002B820-\U0002CEAF\U0002CEB0-\U0002EBEF\uF900-\uFAFF\U0002F800-\U0002FA1F")
_KIMI_K2 = (rf"[{_HAN}]+|[^\r\n\p{{L}}\p{{N}}]?(?:(?![{_HAN}])\p{{L}})+(?:'[sStTmMdD]|'(?:[rR][eE]|[vV][eE]|[lL][lL]))?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+|[\s\S]")
_HAND_WRITTEN: dict[str, str] = {
    GPT2: _GPT2_TILING, LLAMA3: LLAMA3, QWEN2: QWEN2, QWEN35: QWEN35, NEWLINES: NEWLINES, KIMI_K2: _KIMI_K2,
    _STARCODER: _STARCODER}
_DIGIT_GROUPERS = (AFMOE_DIGITS, TINY_AYA_DIGITS)


# ------------------------------------------------------------------------- std::regex emulation
_WHITESPACE = frozenset(map(chr, (*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000)))  # llama.cpp's list
# Unicode class -> (the byte a collapsed character of that class becomes, the class's ASCII members)
_CLASSES = {"N": ("\xd1", "0-9"), "L": ("\xd2", "A-Za-z"), "P": ("\xd3", r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
            "M": ("\xd4", ""), "S": ("\xd5", r"\$\+<->\^`\|~")}
_CLASS_NAMES = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S", "Lu": "L", "Ll": "L", "Lt": "L",
                "Lm": "L", "Lo": "L"}
_OTHER = "\xd0"  # a collapsed character of no class above
_CLASS_OF = [(regex.compile(rf"\p{{{name}}}"), code) for name, (code, _) in _CLASSES.items()]
_ASCII_ESCAPES = {"s": r"\t\n\x0b\x0c\r ", "d": "0-9"}  # C-locale isspace / isdigit
_PROPERTY = regex.compile(r"\\p\{(\w+)\}")


@functools.lru_cache(maxsize=65536)
def _collapsed(char: str) -> str:
    """The byte llama.cpp collapses a non-ASCII character (already Unicode 15.1) to."""
    if char in _WHITESPACE:
        return "\x0b"
    for pattern, code in _CLASS_OF:
        if pattern.match(char):
            return code
    return _OTHER


def _collapse(probe: str) -> str:
    if probe.isascii():
        return probe
    return probe.translate({ord(c): _collapsed(c) for c in set(probe) if c >= "\x80"})


def _widen(text: str) -> str:
    """The text std::wregex sees: non-ASCII whitespace as ``\\v``."""
    if text.isascii():
        return text
    spaces = [c for c in set(text) if c >= "\x80" and c in _WHITESPACE]
    return text.translate(dict.fromkeys(map(ord, spaces), "\x0b")) if spaces else text


def _as_python(pattern: str, collapsed: bool) -> str:
    """An ECMAScript regex as llama.cpp hands it to std::regex -> the same regex for ``regex``
    (compiled with ASCII classes): ``\\p{X}`` collapsed, ``\\s``/``\\d`` spelt out, ``$`` as ``\\Z``."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            prop = _PROPERTY.match(pattern, i)
            if collapsed and prop and prop.group(1) in _CLASS_NAMES:
                code, members = _CLASSES[_CLASS_NAMES[prop.group(1)]]
                out.append(code + members if inside else f"[{code}{members}]")
                i = prop.end()
                continue
            esc = pattern[i + 1:i + 2]
            if esc.lower() in _ASCII_ESCAPES:
                members = _ASCII_ESCAPES[esc.lower()]
                if inside and esc.isupper():
                    raise ValueError(f"cannot translate \\{esc} inside a class: {pattern!r}")
                out.append(members if inside else f"[{'^' if esc.isupper() else ''}{members}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


# ------------------------------------------------------------------------------ the splitter
Spans = list[tuple[int, int]]


class _Step:
    """One regex of a pre-tokenizer: cuts each span of the text into smaller spans."""

    def __init__(self, view: Callable[[str, str], str], cut: Callable[[str], Spans]) -> None:
        self._view = view  # (text, text in Unicode 15.1) -> the string the regex runs on
        self._cut = cut  # a piece of that string -> spans relative to it

    def split(self, text: str, probe: str, spans: Spans) -> Spans:
        view = self._view(text, probe)
        out: Spans = []
        for start, end in spans:
            out.extend((start + a, start + b) for a, b in self._cut(view[start:end]))
        return out


def _tiling(pattern: regex.Pattern[str]) -> Callable[[str], Spans]:
    """A regex whose matches tile the piece (the hand-written splitters)."""
    return lambda piece: [m.span() for m in pattern.finditer(piece)]


def _gaps_too(pattern: regex.Pattern[str]) -> Callable[[str], Spans]:
    """std::regex's split: matches, and the text between them, as pieces; empty ones dropped."""
    def cut(piece: str) -> Spans:
        out: Spans = []
        pos = 0
        for m in pattern.finditer(piece):
            start, end = m.span()
            if start > pos:
                out.append((pos, start))
            if end > start:
                out.append((start, end))
            pos = max(pos, end)
        if pos < len(piece):
            out.append((pos, len(piece)))
        return out
    return cut


_NUMBER = regex.compile(r"\p{N}+")


def _digit_groups(piece: str) -> Spans:
    """llama.cpp's AFMoE digit splitter: a run of digits in groups of three counted from its end.

    As there, the text before a run is not a piece of its own: it joins the run's first group.
    """
    out: Spans = []
    prev = 0
    for m in _NUMBER.finditer(piece):
        start, end = m.span()
        cut = start + (end - start) % 3
        if cut > start:
            out.append((prev, cut))
            prev = cut
        for group_end in range(cut + 3, end + 1, 3):
            out.append((prev, group_end))
            prev = group_end
    if prev < len(piece):
        out.append((prev, len(piece)))
    return out


def _unicode_view(text: str, probe: str) -> str:
    return probe


def _collapsed_view(text: str, probe: str) -> str:
    return _collapse(probe)


def _wide_view(text: str, probe: str) -> str:
    return _widen(text)


def _step(pattern: str) -> _Step:
    if pattern in _DIGIT_GROUPERS:
        return _Step(_unicode_view, _digit_groups)
    if pattern in _HAND_WRITTEN:
        return _Step(_unicode_view, _tiling(regex.compile(_HAND_WRITTEN[pattern])))
    collapsed = any(f"\\p{{{name}}}" in pattern for name in _CLASS_NAMES)
    compiled = regex.compile(_as_python(pattern, collapsed), regex.ASCII | regex.VERSION0)
    return _Step(_collapsed_view if collapsed else _wide_view, _gaps_too(compiled))


class PreTokenizer:
    """Splits text into words as llama.cpp's ``unicode_regex_split`` does for a regex list."""

    def __init__(self, patterns: Sequence[str]) -> None:
        patterns = list(patterns)
        self._single: regex.Pattern[str] | None = None  # one tiling regex: the fast path
        if tuple(patterns[:2]) in _FUSED:
            patterns[:2] = [_FUSED[(patterns[0], patterns[1])]]
        if len(patterns) == 1 and patterns[0] in _HAND_WRITTEN:
            self._single = regex.compile(_HAND_WRITTEN[patterns[0]])
        self._steps = [_step(p) for p in patterns]

    def split(self, text: str) -> list[str]:
        """The words of ``text``, in order; they concatenate to ``text``."""
        probe = _as_unicode_15_1(text)
        if self._single is not None:
            pieces = self._single.findall(probe)
            return pieces if probe is text else _recut(text, pieces)
        spans: Spans = [(0, len(text))] if text else []
        for step in self._steps:
            spans = step.split(text, probe, spans)
        return [text[a:b] for a, b in spans]


def _recut(text: str, pieces: list[str]) -> list[str]:
    """``text`` cut at the lengths of ``pieces`` (a same-length stand-in for it was split)."""
    out, pos = [], 0
    for piece in pieces:
        out.append(text[pos:pos + len(piece)])
        pos += len(piece)
    return out
