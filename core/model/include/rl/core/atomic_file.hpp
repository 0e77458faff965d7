// Crash-safe file writes: write a temporary file in the target's folder,
// fsync it, rename it over the target, fsync the folder. A reader sees the old
// file or the complete new one, never a prefix.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rl::core {

/// Streams bytes into `path` atomically. Nothing is visible at `path` until
/// commit(); a writer destroyed without commit() removes its temporary file.
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(std::string path);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter &) = delete;
    AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;

    void write(const void *data, size_t size);
    void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
    /// fsync + rename + fsync of the folder. Throws Error naming the path on failure.
    void commit();
    const std::string &path() const { return path_; }

private:
    std::string path_;
    std::string tmp_path_;
    int fd_ = -1;
    bool committed_ = false;
};

/// Writes `contents` to `path` atomically.
void atomic_write_file(const std::string &path, std::string_view contents);

/// Reads a whole file; throws Error naming the path when it cannot.
std::string read_file(const std::string &path);

/// fsyncs a folder so that renames inside it are durable.
void fsync_directory(const std::string &dir);

} // namespace rl::core
