// The publisher's thread: spools of terminal executions to artifacts, and retention
// (publisher.hpp).
#include "custos/supervisor/publisher.hpp"

#include <pthread.h>
#include <unistd.h>

#include "custos/core/plan_canonical.hpp"
#include "custos/registry/failpoint.hpp"

namespace custos::supervisor {

namespace {

// Pages of unpublished records read per query at a resume.
constexpr std::size_t kResumePage = 256;

std::string error_text(Error const& e) {
  return e.message();  // "<code>: <context>", what exec.get splits again
}

}  // namespace

OutputPublisher::OutputPublisher(registry::Registry& registry, std::filesystem::path state_dir,
                                 PublisherOptions options)
    : registry_(registry), store_(std::move(state_dir)), options_(std::move(options)) {
  figures_ = store_.measure();
  thread_ = std::thread([this] { run(); });
}

OutputPublisher::~OutputPublisher() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& done : collects_) done(Error{Errc::daemon_shutting_down, "publisher stopped"});
}

void OutputPublisher::publish(std::string execution_id) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(execution_id));
  }
  cv_.notify_one();
}

void OutputPublisher::resume() {
  {
    std::lock_guard<std::mutex> g(mu_);
    resume_requested_ = true;
  }
  cv_.notify_one();
}

void OutputPublisher::collect(std::function<void(Result<CollectReport>)> done) {
  {
    std::lock_guard<std::mutex> g(mu_);
    collects_.push_back(std::move(done));
  }
  cv_.notify_one();
}

registry::StoreFigures OutputPublisher::figures() const {
  std::lock_guard<std::mutex> g(mu_);
  return figures_;
}

void OutputPublisher::run() {
  (void)pthread_setname_np(pthread_self(), "custos-publish");
  auto next_sweep = std::chrono::steady_clock::now() + options_.sweep_interval;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    auto ready = [this] {
      return stop_ || !queue_.empty() || resume_requested_ || !collects_.empty();
    };
    if (options_.sweep_interval.count() > 0) {
      cv_.wait_until(lk, next_sweep, ready);
    } else {
      cv_.wait(lk, ready);
    }
    if (stop_) return;
    if (!collects_.empty()) {
      auto collects = std::move(collects_);
      collects_.clear();
      resume_requested_ = false;  // collect_now retries everything a resume would
      lk.unlock();
      auto report = collect_now();
      for (auto& done : collects) done(report);
      next_sweep = std::chrono::steady_clock::now() + options_.sweep_interval;
      lk.lock();
      continue;
    }
    if (resume_requested_) {
      resume_requested_ = false;
      lk.unlock();
      std::string after;
      for (;;) {
        auto page = registry_.unpublished(after, kResumePage);
        if (!page) {
          if (options_.log) options_.log("publication resume: " + error_text(page.error()));
          break;
        }
        for (auto const& rec : *page) (void)publish_one(rec.execution_id);
        if (page->size() < kResumePage) break;
        after = page->back().execution_id;
      }
      lk.lock();
      continue;
    }
    if (!queue_.empty()) {
      std::string id = std::move(queue_.front());
      queue_.pop_front();
      bool const idle = queue_.empty();
      lk.unlock();
      (void)publish_one(id);
      // Measured once a burst is done, not after every execution of it.
      if (idle) {
        auto f = store_.measure();
        lk.lock();
        figures_ = f;
      } else {
        lk.lock();
      }
      continue;
    }
    if (options_.sweep_interval.count() > 0 && std::chrono::steady_clock::now() >= next_sweep) {
      lk.unlock();
      sweep_now();
      next_sweep = std::chrono::steady_clock::now() + options_.sweep_interval;
      lk.lock();
    }
  }
}

OutputPublisher::StreamCounts OutputPublisher::publish_one(std::string const& execution_id) {
  StreamCounts counts;
  auto rec = registry_.get(execution_id);
  if (!rec || rec->phase != core::Phase::terminal) return counts;
  auto request = core::decode_execution(rec->plan_canonical);
  bool const pty = request && request->plan.io.mode == core::IoMode::pty;
  for (int index = 0; index < 2; ++index) {
    registry::StreamProgress const& s = index == 0 ? rec->out : rec->err;
    if (s.publication_done) continue;
    std::string_view const stream = index == 1 ? "stderr" : pty ? "pty" : "stdout";
    auto const spool = registry::spool_path(store_.state_dir(), execution_id, stream);
    registry::StreamPublication outcome;
    if (s.accounting.retained == 0) {
      outcome.state = registry::PublicationState::empty;
    } else if (auto a = store_.publish(spool, s.accounting.retained); a) {
      outcome.state = registry::PublicationState::published;
      outcome.bytes = a->bytes;
      outcome.artifact = a->digest;
    } else {
      outcome.state = a.error().code == Errc::artifact_spool_missing
                          ? registry::PublicationState::lost
                          : registry::PublicationState::failed;
      outcome.error = error_text(a.error());
      if (options_.log) {
        options_.log("publication of " + execution_id + " " + std::string{stream} + ": " +
                     outcome.error);
      }
    }
    if (auto r = registry_.record_publication(execution_id, index, outcome); !r) {
      if (options_.log) {
        options_.log("publication of " + execution_id + " " + std::string{stream} +
                     " not recorded: " + error_text(r.error()));
      }
      ++counts.failed;
      continue;  // the artifact (if any) stays; the next attempt finds it and dedups
    }
    if (outcome.state == registry::PublicationState::failed) {
      ++counts.failed;
    } else if (outcome.state == registry::PublicationState::published) {
      ++counts.published;
      // The artifact and its record are durable: the spool's bytes are served from there.
      (void)::unlink(spool.c_str());
    }
    if (index == 0) registry::failpoint("between_streams");
  }
  // Empty once every stream is published (or was never written); kept while one is not.
  (void)::rmdir(registry::spool_dir(store_.state_dir(), execution_id).c_str());
  return counts;
}

Result<CollectReport> OutputPublisher::collect_now() {
  CollectReport report;
  std::string after;
  for (;;) {
    auto page = CUSTOS_TRY(registry_.unpublished(after, kResumePage));
    for (auto const& rec : page) {
      ++report.executions_retried;
      auto const c = publish_one(rec.execution_id);
      report.streams_published += c.published;
      report.streams_failed += c.failed;
    }
    if (page.size() < kResumePage) break;
    after = page.back().execution_id;
  }
  report.sweep = CUSTOS_TRY(registry::sweep_output(registry_, store_, options_.retention));
  std::lock_guard<std::mutex> g(mu_);
  figures_ = report.sweep.figures;
  return report;
}

void OutputPublisher::sweep_now() {
  auto r = registry::sweep_output(registry_, store_, options_.retention);
  if (!r) {
    if (options_.log) options_.log("retention sweep: " + error_text(r.error()));
    return;
  }
  if (options_.log && (r->artifacts_removed > 0 || r->spools_removed > 0)) {
    options_.log("retention removed " + std::to_string(r->artifacts_removed) + " artifact(s), " +
                 std::to_string(r->spools_removed) + " spool(s), " +
                 std::to_string(r->bytes_freed) + " bytes");
  }
  std::lock_guard<std::mutex> g(mu_);
  figures_ = r->figures;
}

}  // namespace custos::supervisor
