// rl/core/names.hpp: one table per enumeration that has names, read both ways.
//
// An enumeration whose values are shown in messages, logs or files, and maybe
// read back from a configuration, keeps its names in one table of rows with a
// `value` and a `name` (Named<E>, or a row of its own with more columns);
// name_in() gives a value's name and value_in() the value named, so writing
// and reading a name cannot disagree. Torch-free, header-only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace rl::core {

template <class E>
struct Named {
    E value;
    const char *name;
};

/// The name of `value` in `table`, `otherwise` where the table lacks it.
template <class Row, std::size_t N>
constexpr const char *name_in(const Row (&table)[N], decltype(Row::value) value,
                              const char *otherwise = "?") {
    for (const auto &row : table)
        if (row.value == value) return row.name;
    return otherwise;
}

/// The row named `name` in `table`, null where no row has that name.
template <class Row, std::size_t N>
const Row *row_named(const Row (&table)[N], const std::string &name) {
    for (const auto &row : table)
        if (name == row.name) return &row;
    return nullptr;
}

/// The value named `name` in `table`, none where no row has that name.
template <class Row, std::size_t N>
std::optional<decltype(Row::value)> value_in(const Row (&table)[N], const std::string &name) {
    if (const Row *row = row_named(table, name)) return row->value;
    return std::nullopt;
}

/// The table's names in order, joined by `sep` ("a, b, c"), for messages.
template <class Row, std::size_t N>
std::string names_in(const Row (&table)[N], const char *sep = ", ") {
    std::string s;
    for (const auto &row : table) s += (s.empty() ? "" : sep) + std::string(row.name);
    return s;
}

} // namespace rl::core
