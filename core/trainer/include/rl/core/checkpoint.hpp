// rl/core/checkpoint.hpp: the folder protocol of atomic checkpoints.
//
//   dir/step_<N>/            a complete checkpoint (has the `complete` marker)
//   dir/.tmp-step_<N>-<pid>/ a checkpoint being written by process <pid>
//
// A writer fills a fresh temporary folder (every file written atomically and
// fsynced), writes the `complete` marker last, fsyncs the folder, renames it to
// step_<N> (an existing step_<N> is swapped out atomically, then removed) and
// fsyncs `dir`. A process killed at any moment leaves either no step_<N> or a
// complete one, and never touches the other checkpoints. Readers only consider
// step_<N> folders holding the marker; writers remove temporary folders whose
// process is gone. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

constexpr const char *kCheckpointMarker = "complete";

struct CheckpointFolder {
    std::string path;
    int64_t step = 0;
};

/// Complete checkpoints under `dir`, by ascending step. Empty when `dir` does
/// not exist.
std::vector<CheckpointFolder> list_checkpoints(const std::string &dir);
/// The newest complete checkpoint under `dir`.
std::optional<CheckpointFolder> latest_checkpoint(const std::string &dir);

/// Creates `dir` if needed, removes temporary folders of processes that no
/// longer run (and this process's own leftovers), and creates a fresh
/// dir/.tmp-step_<step>-<pid>/. Returns its path.
std::string begin_checkpoint(const std::string &dir, int64_t step);
/// Writes the marker into `tmp`, fsyncs it, renames it to dir/step_<step> and
/// fsyncs `dir`. Returns the final path.
std::string commit_checkpoint(const std::string &tmp, const std::string &dir, int64_t step);
/// Removes a temporary folder (after a failed save); never throws.
void abandon_checkpoint(const std::string &tmp) noexcept;

/// Moves a finished folder `tmp` to `target` atomically: when `target`
/// exists, the two are exchanged (renameat2 RENAME_EXCHANGE) and the old one
/// removed. fsyncs the parent folder. Used for checkpoints and model saves.
void replace_folder(const std::string &tmp, const std::string &target);

} // namespace rl::core
