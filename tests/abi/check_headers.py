"""The two contracts of abi/ as the headers state them (docs/abi.md, "Two contracts"), and
who owns every pointer that crosses them (docs/ownership.md).

Checks, each failing with the header and the name at fault:
  - the plugin ABI (every header rl_plugin.h reaches) declares no librl function;
  - every librl function (RL_API) says on which thread it may be called and since which
    embedder API version it exists, a version no newer than RL_API_VERSION;
  - every function-pointer member of every struct says on which thread it is called;
  - every pointer has an ownership statement: each pointer parameter (out parameters
    included) and each returned pointer of every librl function, function-pointer member
    and function-pointer type, and each pointer field of every struct. A pointer is
    covered by an ownership tag in its comment ([borrowed], [kept until E],
    [owned by O until E], [static], [released]; in a function's comment "[tag: a, b]"
    covers parameters a and b, a tag without names the returned pointer) or, for a
    parameter, by one of the default rules of docs/ownership.md. A tag must be well formed
    and name pointer parameters that exist; both umbrella headers define every tag;
  - with a librl path: librl exports exactly the rl_* functions the headers declare.

Usage: check_headers.py ABI_DIR [LIBRL]"""

import os
import re
import subprocess
import sys

TAGS = ("[control-thread]", "[worker]", "[call-thread]", "[thread-safe]")

# Ownership tags (docs/ownership.md). END and the names never hold ':' or ']'.
OWN_TAG = re.compile(r"\[(borrowed|static|released|kept until [^\]\[:]+|"
                     r"owned by (\S+) until [^\]\[:]+)(?::([^\]\[]*))?\]")
# Anything that starts like an ownership tag: each must match OWN_TAG in full.
OWN_LIKE = re.compile(r"\[(?:borrowed|static|released|kept|owned)\b[^\]]*\]")
OWNERS = ("caller", "librl", "host", "plugin", "library")
OWN_WORDS = ("[borrowed]", "[kept until", "[owned by", "[static]", "[released]")
SCALARS = re.compile(r"(u?int(8|16|32|64)_t|size_t|double|float|rl_status_t)$")


def read(path):
    with open(path) as f:
        return f.read()


def includes(abi, header, seen):
    """Headers reached from `header` (paths relative to abi), in include order."""
    if header in seen:
        return
    seen.append(header)
    text = read(os.path.join(abi, header))
    for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
        includes(abi, os.path.normpath(os.path.join(os.path.dirname(header), inc)), seen)


def comment_before(text, pos):
    """The comment just above `pos`, allowing other RL_API declarations between (a
    comment over a group of functions); None when there is none."""
    end = text.rfind("*/", 0, pos)
    if end < 0:
        return None
    between = text[end + 2:pos]
    if between.strip() and not re.fullmatch(r"(\s*RL_API[^;]*;)*\s*", between, re.S):
        return None
    return text[text.rfind("/*", 0, end):end]


def trailing_comment(text, pos):
    """The comment that starts on the line of `pos`, after it ("" when none)."""
    line_end = text.find("\n", pos)
    start = text.find("/*", pos, line_end if line_end >= 0 else len(text))
    if start < 0:
        return ""
    return text[start:text.find("*/", start) + 2]


def own_line_comment(text, pos):
    """The comment just above `pos` when it starts a line of its own ("" when none)."""
    end = text.rfind("*/", 0, pos)
    if end < 0 or text[end + 2:pos].strip():
        return ""
    start = text.rfind("/*", 0, end)
    if text[text.rfind("\n", 0, start) + 1:start].strip():
        return ""  # the trailing comment of the line above
    return text[start:end + 2]


def mask(text):
    """`text` with comments and preprocessor lines blanked (newlines kept), so that
    declarations parse at the same offsets."""
    out = list(text)
    for m in re.finditer(r"/\*.*?\*/|//[^\n]*|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", text, re.S | re.M):
        for i in range(m.start(), m.end()):
            if out[i] != "\n":
                out[i] = " "
    return "".join(out)


def closing(s, i):
    """Index of the bracket closing the one at s[i]."""
    pair = {"(": ")", "{": "}"}[s[i]]
    depth = 0
    for j in range(i, len(s)):
        if s[j] == s[i]:
            depth += 1
        elif s[j] == pair:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced %s at offset %d" % (s[i], i))


def params(src):
    """[(name, declaration)] of a parameter list; [] for "void" or nothing."""
    out = []
    for p in src.split(","):
        p = " ".join(p.split())
        if p in ("", "void"):
            continue
        out.append((re.search(r"(\w+)\s*(\[[^\]]*\])?$", p).group(1), p))
    return out


def base_type(decl):
    """The type name of a declaration, without const, volatile, struct and stars."""
    words = [w for w in re.findall(r"\w+", decl.split("*")[0])
             if w not in ("const", "volatile", "struct")]
    return words[0] if words else ""


def tags_in(comment, where, errors):
    """The ownership tags of a comment as [(tag, names or None)]; malformed ones are
    reported against `where`."""
    flat = re.sub(r"\s*\n\s*\*?(?!/)\s*", " ", comment)  # a tag may be wrapped over lines
    found = []
    for m in OWN_LIKE.finditer(flat):
        tag = OWN_TAG.fullmatch(m.group(0))
        if tag is None:
            errors.append("%s: malformed ownership tag %s (docs/ownership.md: [borrowed], "
                          "[kept until E], [owned by O until E], [static], [released], "
                          "optionally followed by ': names')" % (where, m.group(0)))
            continue
        if tag.group(2) is not None and tag.group(2) not in OWNERS:
            errors.append("%s: ownership tag %s: owner '%s' is not one of %s" %
                          (where, m.group(0), tag.group(2), ", ".join(OWNERS)))
        names = None
        if tag.group(3) is not None:
            names = [n.strip() for n in tag.group(3).split(",")]
        found.append(("[%s]" % tag.group(1).strip(), names))
    return found


class Abi:
    """What the ownership defaults need to know of all the headers: the structs' fields
    and the librl functions' names."""

    def __init__(self):
        self.fields = {}  # struct tag and typedef name -> field declarations
        self.functions = set()

    def holds_pointer(self, type_name, seen=()):
        for decl in self.fields.get(type_name, []):
            base = base_type(decl)
            if "*" in decl or (base not in seen and self.holds_pointer(base, seen + (base,))):
                return True
        return False

    def default_rule(self, function, index, name, decl):
        """The default rule of docs/ownership.md covering a pointer parameter, or None."""
        base, stars = base_type(decl), decl.count("*")
        if index == 0 and (function == "destroy" or function.endswith("_destroy")):
            return "[released]"
        if not re.match(r"out(_|$)", name):
            return "[borrowed]"
        if stars == 1 and (SCALARS.match(base) or
                           (base in self.fields and not self.holds_pointer(base))):
            return "[borrowed]"
        handle = re.fullmatch(r"rl_(\w+)_t", base)
        if stars == 2 and handle and "rl_%s_destroy" % handle.group(1) in self.functions:
            return "[owned by caller until rl_%s_destroy]" % handle.group(1)
        return None


def structs_of(masked):
    """[(struct tag, typedef name, offset of "typedef", body start, body end)] of every
    struct a header defines."""
    out = []
    for m in re.finditer(r"\btypedef\s+struct\s+(\w+)\s*\{", masked):
        end = closing(masked, m.end() - 1)
        name = re.match(r"\}\s*(\w+)", masked[end:]).group(1)
        out.append((m.group(1), name, m.start(), m.end(), end))
    return out


def declarations(masked, start, end):
    """[(first offset, ';' offset, text)] of the declarations in masked[start:end]."""
    out = []
    pos = start
    for m in re.finditer(";", masked[start:end]):
        semi = start + m.start()
        text = masked[pos:semi]
        first = pos + len(text) - len(text.lstrip())
        out.append((first, semi, " ".join(text.split())))
        pos = semi + 1
    return out


def check_function(header, where, function, ret, plist, comment, abi, errors):
    """Ownership of the returned pointer and of each pointer parameter of one function."""
    pointers = [n for n, d in plist if "*" in d or "[" in d]
    named = {}
    returned = []
    for tag, names in tags_in(comment, "%s: %s" % (header, where), errors):
        if names is None:
            returned.append(tag)
            continue
        for n in names:
            if n not in pointers:
                errors.append("%s: %s: ownership tag %s names '%s', which is not a pointer "
                              "parameter (those are: %s)" %
                              (header, where, tag, n, ", ".join(pointers) or "none"))
            elif n in named:
                errors.append("%s: %s: parameter %s has two ownership tags" % (header, where, n))
            named[n] = tag
    if "*" in ret:
        if len(returned) != 1:
            errors.append("%s: %s returns a pointer (%s): its comment needs %s ownership tag "
                          "without names, for the returned pointer" %
                          (header, where, ret, "one" if not returned else "only one"))
    elif returned:
        errors.append("%s: %s: ownership tag %s names no parameter, and %s returns no pointer "
                      "(write '%s: name]')" % (header, where, returned[0], where,
                                               returned[0][:-1]))
    for index, (name, decl) in enumerate(plist):
        if name in pointers and name not in named and \
                abi.default_rule(function, index, name, decl) is None:
            errors.append("%s: %s: out parameter %s (%s) has no ownership tag, and no default "
                          "rule of docs/ownership.md covers it (%s)" %
                          (header, where, name, decl,
                           "no rl_*_destroy releases its type" if decl.count("*") > 1
                           else "what it points to holds pointers"))


def check_ownership(abi_dir, header, abi, errors):
    text = read(os.path.join(abi_dir, header))
    masked = mask(text)
    structs = structs_of(masked)
    for _, name, typedef, start, end in structs:
        fields = {}  # pointer field -> (declaration, offset, ';' offset)
        for first, semi, decl in declarations(masked, start, end):
            if "(RL_ABI" not in decl and ("*" in decl):
                fields[re.search(r"(\w+)\s*(\[[^\]]*\])?$", decl).group(1)] = (decl, first, semi)
        # The struct's comment may cover fields by name: "[tag: a, b]".
        covered = {}
        for tag, names in tags_in(own_line_comment(text, typedef), "%s: %s" % (header, name),
                                  errors):
            for n in names or []:
                if n not in fields:
                    errors.append("%s: %s: ownership tag %s names '%s', which is not a pointer "
                                  "field (those are: %s)" %
                                  (header, name, tag, n, ", ".join(fields) or "none"))
                covered[n] = covered.get(n, 0) + 1
            if names is None:
                errors.append("%s: %s: ownership tag %s in a struct's comment must name the "
                              "fields it covers ('%s: field, ...]')" %
                              (header, name, tag, tag[:-1]))
        for field, (decl, first, semi) in fields.items():
            where = "%s: %s.%s" % (header, name, field)
            own = tags_in(own_line_comment(text, first) + trailing_comment(text, semi), where,
                          errors)
            if any(names is not None for _, names in own):
                errors.append("%s: a field's own ownership tag names nothing ('[tag]')" % where)
            if len(own) + covered.get(field, 0) == 0:
                errors.append("%s: pointer field (%s) has no ownership tag (in its comment, or "
                              "naming it in the struct's comment)" % (where, decl))
            elif len(own) + covered.get(field, 0) > 1:
                errors.append("%s: pointer field has more than one ownership tag" % where)
    for m in re.finditer(r"^RL_API\b([^;(]*?)\b(rl_\w+)\s*\(", masked, re.M):
        close = closing(masked, m.end() - 1)
        check_function(header, m.group(2), m.group(2), m.group(1).strip(),
                       params(masked[m.end():close]), comment_before(text, m.start()) or "",
                       abi, errors)
    for m in re.finditer(r"\(RL_ABI \*(\w+)\)\s*\(", masked):
        line_start = masked.rfind("\n", 0, m.start()) + 1
        ret = re.sub(r"^\s*typedef\b", "", masked[line_start:m.start()]).strip()
        close = closing(masked, m.end() - 1)
        owner = [s[1] for s in structs if s[3] <= m.start() < s[4]]
        where = "%s.%s" % (owner[0], m.group(1)) if owner else m.group(1)
        comment = (comment_before(text, line_start) or "") + trailing_comment(text, close)
        check_function(header, where, m.group(1), ret, params(masked[m.end():close]), comment,
                       abi, errors)


def version_minor(abi, name):
    text = read(os.path.join(abi, "rl/version.h"))
    return int(re.search(r"#define %s_MINOR (\d+)" % name, text).group(1))


def main():
    abi = sys.argv[1]
    errors = []
    plugin_side = []
    includes(abi, "rl_plugin.h", plugin_side)
    every = []
    includes(abi, "rl_api.h", every)
    api_minor = version_minor(abi, "RL_API_VERSION")
    declared = set()
    for header in every:
        text = read(os.path.join(abi, header))
        for m in re.finditer(r"^RL_API\b[^;(]*?\b(rl_\w+)\s*\(", text, re.M):
            name = m.group(1)
            declared.add(name)
            if header in plugin_side:
                errors.append("%s: %s is a librl function in the plugin ABI (plugins never "
                              "link librl; move it to an embedder header)" % (header, name))
            com = comment_before(text, m.start())
            if com is None:
                errors.append("%s: %s has no comment" % (header, name))
                continue
            if not any(t in com for t in TAGS):
                errors.append("%s: %s has no thread tag (one of %s)" % (header, name, ", ".join(TAGS)))
            since = re.search(r"\(since 0\.(\d+)\)", com)
            if not since:
                errors.append("%s: %s has no \"(since 0.N)\" note" % (header, name))
            elif int(since.group(1)) > api_minor:
                errors.append("%s: %s is since 0.%s, newer than RL_API_VERSION 0.%d" %
                              (header, name, since.group(1), api_minor))
        for m in re.finditer(r"\(RL_ABI \*(\w+)\)", text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            # The declaration may span lines: its own trailing comment counts too.
            decl_end = text.find(";", m.end())
            trailing = text[line_start:text.find("\n", decl_end)]
            com = comment_before(text, line_start) or ""
            if not any(t in com or t in trailing for t in TAGS):
                errors.append("%s: member %s has no thread tag" % (header, m.group(1)))
    # Ownership: the structs and functions of every header first (the default rules
    # look across headers), then each pointer.
    model = Abi()
    model.functions = declared
    for header in every:
        masked = mask(read(os.path.join(abi, header)))
        for tag, name, _, start, end in structs_of(masked):
            fields = [d for _, _, d in declarations(masked, start, end) if "(RL_ABI" not in d]
            model.fields[tag] = model.fields[name] = fields
    for header in every:
        check_ownership(abi, header, model, errors)
    for umbrella in ("rl_plugin.h", "rl_api.h"):
        head = read(os.path.join(abi, umbrella)).split("*/")[0]
        for word in OWN_WORDS:
            if word not in head:
                errors.append("%s: its first comment does not define the ownership tag %s" %
                              (umbrella, word + ("" if word.endswith("]") else " ...]")))
    if len(sys.argv) > 2:
        out = subprocess.run(["nm", "-D", "--defined-only", sys.argv[2]], capture_output=True,
                             text=True, check=True).stdout
        exported = {l.split()[-1] for l in out.splitlines() if re.search(r" T rl_\w+$", l)}
        for name in sorted(declared - exported):
            errors.append("librl does not export %s, which the headers declare" % name)
        for name in sorted(exported - declared):
            errors.append("librl exports %s, which no header declares" % name)
    for e in errors:
        print(e)
    print("%d functions, %d headers (%d of the plugin ABI): %d problems" %
          (len(declared), len(every), len(plugin_side), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
