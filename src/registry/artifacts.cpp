// The artifact store: publication (copy, hash, fsync, rename, directory fsync), reads, the
// store's figures and the read path of stored output. The retention sweep is retention.cpp.
#include "custos/registry/artifacts.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/core/canonical.hpp"
#include "custos/core/digest.hpp"
#include "custos/registry/failpoint.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::registry {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 20;
// The unit of a publication's pipeline (copy, write-back started, read back and hashed).
constexpr std::uint64_t kSlice = std::uint64_t{16} << 20;

// ENOSPC and EDQUOT are the store's file system being full; everything else is an I/O failure.
Error io_error(int err, std::string what) {
  if (err == ENOSPC || err == EDQUOT) return Error{Errc::artifact_no_space, std::move(what), err};
  return Error{Errc::artifact_io, std::move(what), err};
}

Result<void> ensure_dir(fs::path const& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) return io_error(ec.value(), "create " + p.string());
  return ok();
}

Result<void> fsync_dir(fs::path const& p) {
  sys::UniqueFd d(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || ::fsync(d.get()) != 0) return io_error(errno, "fsync " + p.string());
  return ok();
}

std::string random_name() {
  std::random_device rd;
  std::array<std::uint8_t, 12> b{};
  for (auto& x : b) x = static_cast<std::uint8_t>(rd());
  return core::to_hex(b);
}

// The copy of a spool into its artifact: in the kernel where it can (copy_file_range: no
// user-space copy, a reflink on file systems that share extents), else through a buffer, from
// wherever the kernel copy stopped.
class SliceCopier {
 public:
  SliceCopier(int in, int out, fs::path const& tmp) : in_(in), out_(out), tmp_(tmp) {}

  // Copies bytes [off, off + len) of `in` to the same offsets of `out`.
  Result<void> copy(std::uint64_t off, std::uint64_t len) {
    auto in_off = static_cast<loff_t>(off);
    auto out_off = static_cast<loff_t>(off);
    std::uint64_t const end = off + len;
    while (static_cast<std::uint64_t>(in_off) < end) {
      std::size_t const want = static_cast<std::size_t>(end - static_cast<std::uint64_t>(in_off));
      if (kernel_copy_) {
        ssize_t const n = ::copy_file_range(in_, &in_off, out_, &out_off, want, 0);
        if (n > 0) continue;
        if (n == 0)
          return Error{Errc::artifact_spool_missing, "spool shorter than its record says"};
        if (errno == EINTR) continue;
        if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
          return io_error(errno, "copy to " + tmp_.string());
        kernel_copy_ = false;
        buf_.resize(kChunk);
      }
      std::size_t const piece = std::min(want, kChunk);
      ssize_t const r = ::pread(in_, buf_.data(), piece, in_off);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return io_error(errno, "read the spool");
      if (r == 0) return Error{Errc::artifact_spool_missing, "spool shorter than its record says"};
      std::size_t w = 0;
      while (w < static_cast<std::size_t>(r)) {
        ssize_t const k = ::pwrite(out_, buf_.data() + w, static_cast<std::size_t>(r) - w, out_off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return io_error(errno, "write " + tmp_.string());
        w += static_cast<std::size_t>(k);
        out_off += k;
      }
      in_off += r;
    }
    return ok();
  }

 private:
  int in_;
  int out_;
  fs::path const& tmp_;
  bool kernel_copy_ = true;
  std::vector<std::uint8_t> buf_;
};

// Feeds bytes [off, off + len) of `fd` to `h`, read back from the file itself, so the name is
// the digest of what the artifact holds.
Result<void> hash_back(int fd, std::uint64_t off, std::uint64_t len, core::Sha256Stream& h,
                       std::vector<std::uint8_t>& buf) {
  std::uint64_t const end = off + len;
  while (off < end) {
    std::size_t const want = static_cast<std::size_t>(std::min<std::uint64_t>(end - off, kChunk));
    ssize_t const n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error(n < 0 ? errno : EIO, "read back the artifact");
    CUSTOS_TRYV(h.update(std::span<std::uint8_t const>(buf.data(), static_cast<std::size_t>(n))));
    off += static_cast<std::uint64_t>(n);
  }
  return ok();
}

}  // namespace

fs::path spool_dir(fs::path const& state_dir, std::string_view execution_id) {
  return state_dir / "spool" / std::string{execution_id};
}

fs::path spool_path(fs::path const& state_dir, std::string_view execution_id,
                    std::string_view stream) {
  return spool_dir(state_dir, execution_id) / std::string{stream};
}

ArtifactStore::ArtifactStore(fs::path state_dir) : state_dir_(std::move(state_dir)) {}

fs::path ArtifactStore::path_of(std::string_view digest) const {
  if (!core::Digest::parse(digest)) return {};
  return state_dir_ / "artifacts" / "sha256" /
         std::string{digest.substr(core::Digest::kPrefix.size())};
}

Result<Artifact> ArtifactStore::publish(fs::path const& source, std::uint64_t bytes) {
  sys::UniqueFd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) {
    if (errno == ENOENT)
      return Error{Errc::artifact_spool_missing, "no spool " + source.string(), ENOENT};
    return io_error(errno, "open " + source.string());
  }
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return io_error(errno, "stat " + source.string());
  if (static_cast<std::uint64_t>(st.st_size) < bytes) {
    return Error{Errc::artifact_spool_missing, source.string() + " holds " +
                                                   std::to_string(st.st_size) + " bytes, " +
                                                   std::to_string(bytes) + " were retained"};
  }
  fs::path const sha_dir = state_dir_ / "artifacts" / "sha256";
  fs::path const tmp_dir = state_dir_ / "artifacts" / "tmp";
  CUSTOS_TRYV(ensure_dir(sha_dir));
  CUSTOS_TRYV(ensure_dir(tmp_dir));
  if (failpoint_set("artifact_write_fails"))
    return Error{Errc::artifact_io, "failpoint artifact_write_fails", EIO};

  fs::path const tmp = tmp_dir / random_name();
  sys::UniqueFd out(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out.valid()) return io_error(errno, "create " + tmp.string());
  // Whatever fails from here removes the temporary file: an error leaves nothing behind.
  auto fail = [&tmp](Error e) {
    (void)::unlink(tmp.c_str());
    return e;
  };
  // Slice by slice: copied, its write-back started, then read back and hashed while the disk
  // writes it. The whole file copied first and hashed after would leave the disk idle during
  // the copy and the CPU idle while the write-back was being queued (docs/benchmarks.md, the
  // artifact row); this way the copy and the hash overlap the disk's writing.
  SliceCopier copier(in.get(), out.get(), tmp);
  core::Sha256Stream h;
  std::vector<std::uint8_t> buf(kChunk);
  for (std::uint64_t off = 0; off < bytes;) {
    std::uint64_t const len = std::min<std::uint64_t>(bytes - off, kSlice);
    if (auto r = copier.copy(off, len); !r) return fail(r.error());
    (void)::sync_file_range(out.get(), static_cast<off64_t>(off), static_cast<off64_t>(len),
                            SYNC_FILE_RANGE_WRITE);
    if (auto r = hash_back(out.get(), off, len, h, buf); !r) return fail(r.error());
    off += len;
  }
  auto digest = h.finish();
  if (!digest) return fail(digest.error());
  if (::fdatasync(out.get()) != 0) return fail(io_error(errno, "fdatasync " + tmp.string()));
  out.reset();

  Artifact a{digest->to_string(), bytes, false};
  fs::path const final_path = path_of(a.digest);
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno != EEXIST) return fail(io_error(errno, "rename to " + final_path.string()));
    // The same bytes are already stored: kept as they are. Their modification time is the
    // last publication's, which retention's age counts from.
    (void)::unlink(tmp.c_str());
    a.existed = true;
    if (::utimensat(AT_FDCWD, final_path.c_str(), nullptr, 0) != 0)
      return io_error(errno, "touch " + final_path.string());
  }
  CUSTOS_TRYV(fsync_dir(sha_dir));
  return a;
}

Result<std::vector<std::uint8_t>> ArtifactStore::read(std::string_view digest, std::uint64_t offset,
                                                      std::uint64_t max_bytes) const {
  fs::path const p = path_of(digest);
  if (p.empty()) return Error{Errc::artifact_corrupt, "malformed artifact digest"};
  sys::UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT)
      return Error{Errc::output_removed, "artifact " + std::string{digest} + " was removed"};
    return io_error(errno, "open " + p.string());
  }
  std::vector<std::uint8_t> data(static_cast<std::size_t>(max_bytes));
  std::uint64_t got = 0;
  while (got < max_bytes) {
    ssize_t const n =
        ::pread(fd.get(), data.data() + got, max_bytes - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error(errno, "read " + p.string());
    if (n == 0) break;
    got += static_cast<std::uint64_t>(n);
  }
  data.resize(static_cast<std::size_t>(got));
  return data;
}

StoreFigures ArtifactStore::measure() const {
  StoreFigures f;
  std::error_code ec;
  for (auto const& e : fs::directory_iterator(state_dir_ / "spool", ec)) {
    if (!e.is_directory(ec)) continue;
    ++f.spool_executions;
    for (auto const& s : fs::directory_iterator(e.path(), ec)) {
      auto const n = s.file_size(ec);
      if (!ec) f.spool_bytes += n;
    }
  }
  for (auto const& e : fs::directory_iterator(state_dir_ / "artifacts" / "sha256", ec)) {
    auto const n = e.file_size(ec);
    if (ec) continue;
    ++f.artifacts;
    f.artifact_bytes += n;
  }
  timespec ts{};
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  f.measured_ns = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  return f;
}

Result<StoredSlice> read_stored_output(ArtifactStore const& store, ExecutionRecord const& record,
                                       bool pty, std::string_view stream, std::uint64_t offset,
                                       std::uint64_t max_bytes) {
  StreamProgress const* s = nullptr;
  std::string_view file;
  if (stream == "stderr" && !pty) {
    s = &record.err;
    file = "stderr";
  } else if (stream == "stdout" || (stream == "pty" && pty)) {
    s = &record.out;
    file = pty ? "pty" : "stdout";
  } else {
    return Error{Errc::plan_invalid_value,
                 "no stream " + std::string{stream} + " in this execution"};
  }
  StoredSlice slice;
  slice.complete = s->accounting.complete;
  std::uint64_t const size = s->accounting.retained;
  std::uint64_t const want = offset < size ? std::min(max_bytes, size - offset) : 0;
  bool spool_short = false;  // the spool ended before the retained bytes (nothing more comes)
  if (want > 0) {
    // The spool while it is there (it is the artifact's source and holds the same prefix),
    // else the artifact it was published to.
    fs::path const p = spool_path(store.state_dir(), record.execution_id, file);
    sys::UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.valid()) {
      slice.data.resize(static_cast<std::size_t>(want));
      std::uint64_t got = 0;
      while (got < want) {
        ssize_t const n = ::pread(fd.get(), slice.data.data() + got, want - got,
                                  static_cast<off_t>(offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return io_error(errno, "read " + p.string());
        if (n == 0) {
          spool_short = true;
          break;
        }
        got += static_cast<std::uint64_t>(n);
      }
      slice.data.resize(static_cast<std::size_t>(got));
    } else if (errno != ENOENT) {
      return io_error(errno, "open " + p.string());
    } else if (s->publication == PublicationState::published) {
      slice.data = CUSTOS_TRY(store.read(s->artifact, offset, want));
    } else {
      return Error{Errc::artifact_spool_missing,
                   record.execution_id + ": " + std::string{file} +
                       " has neither a spool nor an artifact" +
                       (s->publication_error.empty() ? "" : " (" + s->publication_error + ")")};
    }
  }
  slice.eof =
      record.phase == core::Phase::terminal && (spool_short || offset + slice.data.size() >= size);
  return slice;
}

Result<StoredSlice> read_stored_output(Registry& registry, ArtifactStore const& store,
                                       ExecutionRecord const& record, bool pty,
                                       std::string_view stream, std::uint64_t offset,
                                       std::uint64_t max_bytes) {
  auto slice = read_stored_output(store, record, pty, stream, offset, max_bytes);
  if (slice || slice.error().code != Errc::artifact_spool_missing) return slice;
  auto fresh = CUSTOS_TRY(registry.get(record.execution_id));
  return read_stored_output(store, fresh, pty, stream, offset, max_bytes);
}

}  // namespace custos::registry
