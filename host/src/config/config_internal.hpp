// host/src/config/config_internal.hpp: private to host/src/config: the limits, key-table and
// text helpers that config.cpp, config_keys.cpp and config_declare.cpp share.
#pragma once

#include "rl/host/config.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace rl::host::config_detail {

using json = nlohmann::json;

// Limits on what one YAML source (the file, or one --set value) may expand
// to. yaml-cpp gives each alias the very node of its anchor, so a few hundred
// bytes can stand for billions of values (aliases of aliases: "billion
// laughs"), and an alias inside its own anchor (`a: &x {b: *x}`, or a merge
// key `<<: *x` that points back) for an infinite tree. The conversion to JSON
// walks the tree as written out: it refuses a node that is one of its own
// ancestors and counts what it visits.
//
// Nodes (scalars, lists, mappings; a node reached through N aliases counts N
// times) one source may expand to: run configurations hold hundreds. At a
// million, refusing an alias bomb of a few hundred bytes took over a second
// (9 s under the sanitizers, found by fuzz_yaml_config); 100,000 takes a
// tenth of that.
inline constexpr size_t kMaxConfigNodes = 100'000;
// Nesting depth: the most parts of a key path (`env.params.a` has 3; a list
// item counts as a part), in a file and in a --set key plus its value.
inline constexpr size_t kMaxConfigDepth = 128;
// Characters of a user's value quoted in a message before it is cut.
inline constexpr size_t kMaxShownChars = 80;

// Throws HostError{RL_ERR_INVALID_ARG} "<where>: <what>".
[[noreturn]] void bad(const std::string &where, const std::string &what);

using Keys = std::vector<ConfigKey>;

const ConfigKey *find_key(const Keys &keys, const std::string &path);
// Names directly under `prefix` ("" for the top level).
std::vector<std::string> children(const Keys &keys, const std::string &prefix);
bool is_section(const Keys &keys, const std::string &path);
std::string join(const std::vector<std::string> &xs);

// The byte offset of the first ill-formed UTF-8 in `s`, or npos.
size_t bad_utf8_at(const std::string &s);
// `s` for a message: control characters and ill-formed UTF-8 as \xHH, cut
// after kMaxShownChars characters.
std::string printable(const std::string &s);

// The parts of a dotted key path.
size_t parts_of(const std::string &key);
void set_path(json &cfg, const std::string &path, json value);

} // namespace rl::host::config_detail
