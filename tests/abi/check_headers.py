"""The two contracts of abi/ as the headers state them (docs/abi.md, "Two contracts").

Checks, each failing with the header and the name at fault:
  - the plugin ABI (every header rl_plugin.h reaches) declares no librl function;
  - every librl function (RL_API) says on which thread it may be called and since which
    embedder API version it exists, a version no newer than RL_API_VERSION;
  - every function-pointer member of every struct says on which thread it is called;
  - with a librl path: librl exports exactly the rl_* functions the headers declare.

Usage: check_headers.py ABI_DIR [LIBRL]"""

import os
import re
import subprocess
import sys

TAGS = ("[control-thread]", "[worker]", "[call-thread]", "[thread-safe]")


def includes(abi, header, seen):
    """Headers reached from `header` (paths relative to abi), in include order."""
    if header in seen:
        return
    seen.append(header)
    text = open(os.path.join(abi, header)).read()
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


def version_minor(abi, name):
    text = open(os.path.join(abi, "rl/version.h")).read()
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
        text = open(os.path.join(abi, header)).read()
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
