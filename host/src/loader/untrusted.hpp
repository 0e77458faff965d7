// Checks on what reaches the host from outside its control: a plugin library's
// file before dlopen maps it, and the strings a plugin hands the host (its
// descriptors, failure and log messages). Internal to librl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rl::host {

// Limits on what one plugin library may declare (docs/abi.md, "Loading").
//
// Descriptors a factory's count() may report: more refuses the whole library
// (a corrupt or hostile count of 2^32-1 would otherwise be walked, and refused,
// one by one).
constexpr uint32_t kMaxPluginsPerLibrary = 4096;
// Bytes in a descriptor's id, kind, name or version, and in each feature
// string: longer refuses the descriptor.
constexpr size_t kMaxDescriptorFieldBytes = 256;
// Bytes in a descriptor's description (it may span lines): longer refuses it.
constexpr size_t kMaxDescriptionBytes = 4096;
// Strings in a descriptor's NULL-terminated features list: more refuses it.
constexpr size_t kMaxDescriptorFeatures = 64;
// Bytes kept of one message a plugin passes to host->fail or host->log; the
// rest is cut and marked.
constexpr size_t kMaxPluginMessageBytes = 16384;

// Refuses (throws HostError) a file that dlopen must not be given: not a
// regular file (a FIFO, socket, device or directory: never opened in a
// blocking way), not an ELF shared object of this machine's class, byte order
// and architecture, or one whose program header table, section header table or
// any segment's file range lies past the end of the file (a truncated library,
// which would fault inside dlopen when the loader touches the missing pages).
void check_library_file(const std::string &path);

// Why `s` is not acceptable as a one-line plugin-supplied text of at most
// `max_bytes` bytes: "" when it is valid UTF-8 without control characters (tab
// and newline are allowed when `multiline`). Reads at most max_bytes + 1 bytes
// of `s`, so an unterminated string is not followed past the limit.
std::string text_problem(const char *s, size_t max_bytes, bool multiline = false);

// `s` with every byte that is not part of a valid UTF-8 sequence, and every
// control character (but tab and newline when `multiline`), written as \xNN;
// the result is valid UTF-8 and safe to print or to put in JSON. At most
// `max_shown` bytes of `s` are shown, then "...".
std::string escape_text(std::string_view s, bool multiline = false,
                        size_t max_shown = static_cast<size_t>(-1));

// `s` (a NUL-terminated plugin message) escaped, and cut after
// kMaxPluginMessageBytes bytes with a note saying so.
std::string plugin_message(const char *s);

} // namespace rl::host
