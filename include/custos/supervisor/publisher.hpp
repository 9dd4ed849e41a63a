// OutputPublisher: publishes the spools of terminal executions to the artifact store and keeps
// the retained output within its retention policy (docs/durability.md, "Output").
//
// It runs on its own thread (custos-publish), never on the event loop: publication copies,
// hashes and fsyncs whole spools, and the retention sweep walks directories. The loop only
// queues an execution id (publish(), from ManagerConfig::terminal_recorded, after the terminal
// record is in the registry), so publication never delays a launch, an answer or a terminal
// result. Per stream, in order (stdout or pty, then stderr):
//   - done already (published, empty, lost): skipped, so a retry redoes only what is missing;
//   - nothing retained: recorded `empty`, and no artifact is made;
//   - else the retained bytes of its spool become an artifact (ArtifactStore::publish), and
//     the outcome is recorded (Registry::record_publication): `published` with the digest, or
//     `failed` with the error (artifact.no_space, artifact.io: publication_retry; the spool is
//     kept), or `lost` when the spool is gone (artifact.spool_missing); a published stream's
//     spool file is removed once its progress is recorded.
// The failpoint `between_streams` (registry/failpoint.hpp) kills the daemon after the first
// stream's outcome is recorded.
//
// Thread safety: every public member may be called from any thread; `done` callbacks run on the
// publisher's thread (post them to your loop).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/registry/artifacts.hpp"
#include "custos/registry/registry.hpp"

namespace custos::supervisor {

struct PublisherOptions {
  registry::RetentionPolicy retention;
  // How often the retention sweep runs on its own (0: only on collect()).
  std::chrono::milliseconds sweep_interval{std::chrono::minutes{10}};
  // Told each failed publication and sweep (the daemon logs them); called on the publisher's
  // thread. Empty: not told.
  std::function<void(std::string const& message)> log;
};

// What one collect() did: the publications it retried and the sweep after them.
struct CollectReport {
  std::uint64_t executions_retried = 0;  // terminal executions with a stream still to publish
  std::uint64_t streams_published = 0;
  std::uint64_t streams_failed = 0;  // still failed after the retry (publication_retry)
  registry::SweepReport sweep;
};

class OutputPublisher {
 public:
  OutputPublisher(registry::Registry& registry, std::filesystem::path state_dir,
                  PublisherOptions options);
  // Stops the thread after the execution it is publishing (queued ones stay pending in the
  // registry: the next start resumes them).
  ~OutputPublisher();
  OutputPublisher(OutputPublisher const&) = delete;
  OutputPublisher& operator=(OutputPublisher const&) = delete;

  // Queues one terminal execution. Cheap: a lock and a notify.
  void publish(std::string execution_id);
  // Queues every terminal execution whose publication is not done (a daemon start: what a
  // previous daemon left pending, failed or half done).
  void resume();
  // Retries every unfinished publication, then sweeps; `done` gets the report.
  void collect(std::function<void(Result<CollectReport>)> done);
  // The store's figures after the last publication batch or sweep.
  [[nodiscard]] registry::StoreFigures figures() const;
  [[nodiscard]] registry::RetentionPolicy const& retention() const noexcept {
    return options_.retention;
  }

 private:
  struct StreamCounts {
    std::uint64_t published = 0;
    std::uint64_t failed = 0;
  };
  void run();
  StreamCounts publish_one(std::string const& execution_id);
  Result<CollectReport> collect_now();
  void sweep_now();

  registry::Registry& registry_;
  registry::ArtifactStore store_;
  PublisherOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool resume_requested_ = false;
  std::vector<std::function<void(Result<CollectReport>)>> collects_;
  bool stop_ = false;
  registry::StoreFigures figures_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace custos::supervisor
