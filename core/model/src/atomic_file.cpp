#include "rl/core/atomic_file.hpp"

#include "rl/core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace rl::core {
namespace fs = std::filesystem;

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
    fs::path p(path_);
    check(!p.filename().empty(), "cannot write '" + path_ + "': not a file path");
    tmp_path_ = (p.parent_path() / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
    std::vector<char> templ(tmp_path_.begin(), tmp_path_.end());
    templ.push_back('\0');
    fd_ = ::mkstemp(templ.data());
    if (fd_ < 0) throw_errno("cannot create a temporary file next to '" + path_ + "'");
    tmp_path_.assign(templ.data());
    // mkstemp creates 0600; published files get the usual 0644 (minus umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    if (::fchmod(fd_, 0644 & ~mask) != 0) {
        ::close(fd_);
        ::unlink(tmp_path_.c_str());
        fd_ = -1;
        throw_errno("cannot set permissions of '" + tmp_path_ + "'");
    }
}

AtomicFileWriter::~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void *data, size_t size) {
    check(fd_ >= 0 && !committed_, "write to '" + path_ + "' after commit");
    const char *p = static_cast<const char *>(data);
    while (size > 0) {
        const size_t step = size < (size_t(1) << 30) ? size : (size_t(1) << 30);
        const ssize_t n = ::write(fd_, p, step);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_errno("cannot write '" + path_ + "'");
        }
        p += n;
        size -= static_cast<size_t>(n);
    }
}

void AtomicFileWriter::commit() {
    check(fd_ >= 0 && !committed_, "'" + path_ + "' committed twice");
    if (::fsync(fd_) != 0) throw_errno("cannot fsync '" + tmp_path_ + "'");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno("cannot close '" + tmp_path_ + "'");
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
        throw_errno("cannot rename '" + tmp_path_ + "' to '" + path_ + "'");
    committed_ = true;
    fs::path parent = fs::path(path_).parent_path();
    fsync_directory(parent.empty() ? std::string(".") : parent.string());
}

void atomic_write_file(const std::string &path, std::string_view contents) {
    AtomicFileWriter w(path);
    w.write(contents);
    w.commit();
}

std::string read_file(const std::string &path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw Error("cannot read '" + path + "': it is a folder");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open '" + path + "' for reading");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error("cannot read '" + path + "'");
    return ss.str();
}

void fsync_directory(const std::string &dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open folder '" + dir + "' to fsync it");
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0 && errno != EINVAL) throw_errno("cannot fsync folder '" + dir + "'");
}

} // namespace rl::core
