#!/usr/bin/env python3
"""Writes core/model/src/unicode_tables.cpp: the General_Category of every code
point, as runs, for the tokenizer's regular expressions (core/model/src/
unicode.cpp rewrites \\p{L}, \\p{N}, ... into these code-point ranges so that
PCRE2's own, older tables do not decide).

The data come from the PyPI package `unicodedata2` at the Unicode version that
Hugging Face `tokenizers` follows (its Oniguruma; 16.0.0 for tokenizers 0.22).
The file also lists where the categories of the Unicode version of PCRE2's
own tables (14.0.0 in Debian 12's PCRE2 10.42) differ, taken from the Python
standard library's `unicodedata` (Unicode 14.0.0 in Debian 12's Python 3.11):
with them a class is written as PCRE2's property plus the code points added
since, which PCRE2 matches far faster than long range lists.

Last, the code points unassigned in Unicode 9.0.0, the version of the tables
of Hugging Face's normalizers (NFC, NFKC, ...: its `unicode-normalization-
alignments` crate); core/model/src/unicode.cpp keeps them out of utf8proc's
normalization (Unicode 15.0 in Debian 12), as Hugging Face leaves them
unchanged. They come from a Python whose `unicodedata` has Unicode 9.0.0
(Python 3.6), run as a subprocess.

    python3 -m venv /tmp/ucd && /tmp/ucd/bin/pip install unicodedata2==16.0.0
    /tmp/ucd/bin/python scripts/gen_unicode_tables.py core/model/src/unicode_tables.cpp \
        --normalization-python python3.6

core_tokenizer_compare_test checks the result against `tokenizers` itself on
every code point (tests/core/tokenizer_hf_expected.py probes its classes).

Usage: gen_unicode_tables.py OUT_FILE [--version V] [--base-version V]
                             [--normalization-python PY] [--normalization-version V]
"""
import argparse
import json
import subprocess
import sys
import unicodedata

import unicodedata2

# The order of rl::core::unicode::Gc (core/model/src/unicode_tables.hpp).
CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd",
              "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc",
              "Cf", "Cs", "Co", "Cn"]


def runs():
    """[(first code point, category)] covering U+0000..U+10FFFF."""
    out = []
    for cp in range(0x110000):
        gc = unicodedata2.category(chr(cp))
        if not out or out[-1][1] != gc:
            out.append((cp, gc))
    return out


def base_diffs():
    """[(first, last, category in the base version)] where it differs."""
    out = []
    for cp in range(0x110000):
        old = unicodedata.category(chr(cp))
        if old == unicodedata2.category(chr(cp)):
            continue
        if out and out[-1][1] == cp - 1 and out[-1][2] == old:
            out[-1][1] = cp
        else:
            out.append([cp, cp, old])
    return out


# Run by the normalization Python: its Unicode version and unassigned ranges.
UNASSIGNED = """
import json, unicodedata
out = []
for cp in range(0x110000):
    if unicodedata.category(chr(cp)) != "Cn":
        continue
    if out and out[-1][1] == cp - 1:
        out[-1][1] = cp
    else:
        out.append([cp, cp])
print(json.dumps([unicodedata.unidata_version, out]))
"""


def initializer_rows(items, per_row):
    """Array initializer lines: `per_row` items each, indented by four."""
    return ["    " + " ".join(items[i:i + per_row]) for i in range(0, len(items), per_row)]


def table(ctype, name, items, per_row, count):
    """Lines of `const ctype name[]` with `per_row` items a row (left to the
    generator by clang-format) and its element count `count`, as clang-format
    writes them, then a blank line."""
    size = "const size_t %s = sizeof %s / sizeof %s[0];" % (count, name, name)
    if len(size) > 100:  # the .clang-format column limit: clang-format breaks after `=`
        size = "const size_t %s =\n    sizeof %s / sizeof %s[0];" % (count, name, name)
    return (["// clang-format off", "const %s %s[] = {" % (ctype, name)]
            + initializer_rows(items, per_row) + ["};", "// clang-format on", "", size, ""])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--version", default="16.0.0", help="Unicode of HF's regex engine")
    ap.add_argument("--base-version", default="14.0.0", help="Unicode of PCRE2's tables")
    ap.add_argument("--normalization-python", default="python3.6")
    ap.add_argument("--normalization-version", default="9.0.0",
                    help="Unicode of HF's normalizers")
    args = ap.parse_args()
    want, base = args.version, args.base_version
    if unicodedata2.unidata_version != want:
        sys.exit("unicodedata2 has Unicode %s, want %s (pip install unicodedata2==%s)" %
                 (unicodedata2.unidata_version, want, want))
    if unicodedata.unidata_version != base:
        sys.exit("this Python's unicodedata has Unicode %s, want %s (PCRE2's tables)" %
                 (unicodedata.unidata_version, base))
    try:
        norm_version, unassigned = json.loads(subprocess.check_output(
            [args.normalization_python, "-c", UNASSIGNED]))
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("cannot run %s: %s" % (args.normalization_python, e))
    if norm_version != args.normalization_version:
        sys.exit("%s has Unicode %s, want %s" % (args.normalization_python, norm_version,
                                                 args.normalization_version))
    rs = runs()
    diffs = base_diffs()
    lines = [
        "// Generated by scripts/gen_unicode_tables.py from unicodedata2 (Unicode %s)."
        % unicodedata2.unidata_version,
        "// Do not edit: regenerate (see docs/model.md, \"Unicode versions\").",
        "#include \"unicode_tables.hpp\"",
        "",
        "namespace rl::core::unicode {",
        "",
        "const char kTablesUnicodeVersion[] = \"%s\";" % unicodedata2.unidata_version,
        "const char kBaseUnicodeVersion[] = \"%s\";" % base,
        "",
    ]
    lines += table("GcRun", "kGcRuns", ["{0x%05X, Gc::%s}," % tuple(r) for r in rs], 4,
                   "kGcRunCount")
    lines += table("BaseDiff", "kBaseDiffs",
                   ["{0x%05X, 0x%05X, Gc::%s}," % tuple(d) for d in diffs], 3, "kBaseDiffCount")
    lines += [
        "const char kNormalizationUnicodeVersion[] = \"%s\";" % norm_version,
        "",
    ]
    lines += table("CpRange", "kNormalizationUnassigned",
                   ["{0x%05X, 0x%05X}," % tuple(u) for u in unassigned], 4,
                   "kNormalizationUnassignedCount")
    lines += [
        "} // namespace rl::core::unicode",
        "",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("wrote %d runs (Unicode %s), %d differences from Unicode %s and %d ranges unassigned "
          "in Unicode %s to %s" % (len(rs), unicodedata2.unidata_version, len(diffs), base,
                                   len(unassigned), norm_version, args.out))


if __name__ == "__main__":
    main()
