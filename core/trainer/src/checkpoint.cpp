#include "rl/core/checkpoint.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace rl::core {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void io_error(const std::string &msg) {
    throw Error(ErrorKind::Io, msg);
}

// "step_<digits>" -> N
std::optional<int64_t> parse_step_name(const std::string &name) {
    const std::string prefix = "step_";
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0)
        return std::nullopt;
    int64_t n = 0;
    for (size_t i = prefix.size(); i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return std::nullopt;
        if (n > (INT64_MAX - 9) / 10) return std::nullopt;
        n = n * 10 + (name[i] - '0');
    }
    return n;
}

// ".tmp-step_<N>-<pid>" -> pid
std::optional<pid_t> parse_temp_pid(const std::string &name) {
    if (name.rfind(".tmp-step_", 0) != 0) return std::nullopt;
    const size_t dash = name.rfind('-');
    if (dash == std::string::npos || dash + 1 >= name.size()) return std::nullopt;
    long pid = 0;
    for (size_t i = dash + 1; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return std::nullopt;
        pid = pid * 10 + (name[i] - '0');
        if (pid > 1L << 31) return std::nullopt;
    }
    return static_cast<pid_t>(pid);
}

bool process_alive(pid_t pid) {
    if (pid <= 0) return false;
    return ::kill(pid, 0) == 0 || errno == EPERM;
}

void remove_all_quietly(const fs::path &p) noexcept {
    std::error_code ec;
    fs::remove_all(p, ec);
}

} // namespace

std::vector<CheckpointFolder> list_checkpoints(const std::string &dir) {
    std::vector<CheckpointFolder> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto &entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        const auto step = parse_step_name(name);
        if (!step || !entry.is_directory(ec)) continue;
        if (!fs::is_regular_file(entry.path() / kCheckpointMarker, ec)) continue;
        out.push_back({entry.path().string(), *step});
    }
    if (ec) io_error("cannot list checkpoint folder '" + dir + "': " + ec.message());
    std::sort(out.begin(), out.end(),
              [](const CheckpointFolder &a, const CheckpointFolder &b) { return a.step < b.step; });
    return out;
}

std::optional<CheckpointFolder> latest_checkpoint(const std::string &dir) {
    auto all = list_checkpoints(dir);
    if (all.empty()) return std::nullopt;
    return all.back();
}

std::string begin_checkpoint(const std::string &dir, int64_t step) {
    require(!dir.empty(), ErrorKind::InvalidArgument, "checkpoint folder path is empty");
    require(step >= 0, ErrorKind::InvalidArgument, "checkpoint step must be >= 0");
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
        io_error("cannot create checkpoint folder '" + dir +
                 "': " + (ec ? ec.message() : std::string("not a folder")));
    const pid_t self = ::getpid();
    for (const auto &entry : fs::directory_iterator(dir, ec)) {
        const auto pid = parse_temp_pid(entry.path().filename().string());
        if (pid && (*pid == self || !process_alive(*pid))) remove_all_quietly(entry.path());
    }
    const fs::path tmp =
        fs::path(dir) / (".tmp-step_" + std::to_string(step) + "-" + std::to_string(self));
    remove_all_quietly(tmp);
    if (!fs::create_directory(tmp, ec))
        io_error("cannot create temporary checkpoint folder '" + tmp.string() +
                 "': " + ec.message());
    return tmp.string();
}

void replace_folder(const std::string &tmp, const std::string &target) {
    const fs::path parent =
        fs::path(target).parent_path().empty() ? fs::path(".") : fs::path(target).parent_path();
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
        if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR)
            io_error("cannot rename '" + tmp + "' to '" + target + "': " + std::strerror(errno));
        // The target exists: exchange atomically, then drop the old contents.
        if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
            io_error("cannot replace '" + target + "' with '" + tmp + "': " + std::strerror(errno));
        fsync_directory(parent.string());
        remove_all_quietly(tmp); // now holds the old folder
    }
    fsync_directory(parent.string());
}

std::string commit_checkpoint(const std::string &tmp, const std::string &dir, int64_t step) {
    atomic_write_file((fs::path(tmp) / kCheckpointMarker).string(),
                      "step " + std::to_string(step) + "\n");
    fsync_directory(tmp);
    const std::string final_path = (fs::path(dir) / ("step_" + std::to_string(step))).string();
    replace_folder(tmp, final_path);
    return final_path;
}

void abandon_checkpoint(const std::string &tmp) noexcept {
    remove_all_quietly(tmp);
}

} // namespace rl::core
