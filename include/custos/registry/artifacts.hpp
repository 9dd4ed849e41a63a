// Retained output under the state directory: the spool files a running execution writes, the
// content-addressed artifact store its completed streams are published to, the read path that
// serves a stream from either, and the retention sweep (docs/durability.md, "Output").
//
// Layout:
//   <state_dir>/spool/<execution_id>/<stream>   the spool (stdout, stderr or pty), written in
//                                                order by the supervisor; a prefix of the stream
//   <state_dir>/artifacts/sha256/<64 hex>        an artifact: bytes whose SHA-256 is its name
//   <state_dir>/artifacts/tmp/                   artifacts being written (never read)
//
// Nothing here knows the event loop; every call may block on the file system, so the daemon
// makes them on its publisher thread (supervisor/publisher.hpp), never on the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/registry/registry.hpp"

namespace custos::registry {

[[nodiscard]] std::filesystem::path spool_dir(std::filesystem::path const& state_dir,
                                              std::string_view execution_id);
// `stream` is the stream's wire name (stdout, stderr, pty).
[[nodiscard]] std::filesystem::path spool_path(std::filesystem::path const& state_dir,
                                               std::string_view execution_id,
                                               std::string_view stream);

struct Artifact {
  std::string digest;  // "sha256:<hex>"
  std::uint64_t bytes = 0;
  bool existed = false;  // the store already held these bytes: nothing was renamed over them
};

// What the output store holds, measured by walking it.
struct StoreFigures {
  std::uint64_t spool_bytes = 0;
  std::uint64_t spool_executions = 0;  // spool directories
  std::uint64_t artifact_bytes = 0;
  std::uint64_t artifacts = 0;
  std::int64_t measured_ns = 0;  // CLOCK_REALTIME of the walk
};

// 0 means "no bound" for either.
struct RetentionPolicy {
  std::chrono::seconds age{0};
  std::uint64_t bytes = 0;
};

struct SweepReport {
  std::uint64_t artifacts_removed = 0;
  std::uint64_t spools_removed = 0;
  std::uint64_t bytes_freed = 0;
  StoreFigures figures;  // after the sweep
};

// A slice of a stored stream, as exec.output answers it.
struct StoredSlice {
  std::vector<std::uint8_t> data;
  bool eof = false;
  bool complete = false;
};

class ArtifactStore {
 public:
  explicit ArtifactStore(std::filesystem::path state_dir);

  [[nodiscard]] std::filesystem::path const& state_dir() const noexcept { return state_dir_; }
  // <state_dir>/artifacts/sha256/<hex> of a "sha256:<hex>" digest (empty for a malformed one).
  [[nodiscard]] std::filesystem::path path_of(std::string_view digest) const;

  // Publishes the first `bytes` bytes of `source` (bytes > 0): copied to a temporary file in
  // the store slice by slice, each slice's write-back started and the slice read back from the
  // temporary file and hashed, fdatasync'ed, renamed to its digest's name without
  // replacing an existing artifact (an existing one is kept as is and its modification time
  // refreshed, for retention), then the directory fsync'ed. When this returns ok, the artifact
  // is on stable storage under its name.
  // Errors: artifact.spool_missing (no source, or shorter than `bytes`), artifact.no_space
  // (ENOSPC, EDQUOT), artifact.io (any other failure). Nothing is left behind on an error.
  [[nodiscard]] Result<Artifact> publish(std::filesystem::path const& source, std::uint64_t bytes);

  // Bytes [offset, offset + max_bytes) of an artifact. Errors: output.removed (not in the
  // store: retention removed it), artifact.io.
  [[nodiscard]] Result<std::vector<std::uint8_t>> read(std::string_view digest,
                                                       std::uint64_t offset,
                                                       std::uint64_t max_bytes) const;

  [[nodiscard]] StoreFigures measure() const;

 private:
  std::filesystem::path state_dir_;
};

// A stream of a record the daemon does not hold in memory (or holds as terminal), served from
// its spool while the spool is there, else from its artifact; `complete` is the stream's
// accounting, `eof` is set at the end of the retained bytes of a terminal record. `pty` says
// whether the execution has one terminal stream (stdout then names it).
// Errors: plan.invalid_value (no such stream in this execution), output.removed (retention
// removed it), artifact.spool_missing (neither spool nor artifact), artifact.io.
[[nodiscard]] Result<StoredSlice> read_stored_output(ArtifactStore const& store,
                                                     ExecutionRecord const& record, bool pty,
                                                     std::string_view stream, std::uint64_t offset,
                                                     std::uint64_t max_bytes);
// The same for `record` as read from `registry` a moment ago. The publisher records a stream's
// publication and only then removes its spool, so a spool found missing under a record that was
// read before the publication is read again from the artifact the registry now names (once: a
// second miss is the stream's own state). Errors: read_stored_output's, and the registry's.
[[nodiscard]] Result<StoredSlice> read_stored_output(Registry& registry, ArtifactStore const& store,
                                                     ExecutionRecord const& record, bool pty,
                                                     std::string_view stream, std::uint64_t offset,
                                                     std::uint64_t max_bytes);

// The retention sweep (docs/durability.md, "Retention"). Removes:
//   - spool directories of terminal executions whose every stream's publication is done
//     (their artifacts hold the bytes), at once;
//   - spool directories no record names, once older than policy.age;
//   - leftovers of interrupted publications in artifacts/tmp;
//   - artifacts older than policy.age (by modification time: their last publication), then
//     the oldest artifacts while spools and artifacts together exceed policy.bytes.
// Never removed: the spool of a live execution, of a stream still to be published (pending,
// failed), or of a record that is quarantined or cannot be read.
[[nodiscard]] Result<SweepReport> sweep_output(Registry& registry, ArtifactStore& store,
                                               RetentionPolicy const& policy);

}  // namespace custos::registry
